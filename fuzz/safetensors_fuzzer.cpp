// libFuzzer target for the safetensors reader: any input either opens or is refused with
// Error(invalid_argument). An opened file's entries lie inside the input and tile its data
// section, every tensor can be read in full (ASan checks the bounds), a view exists exactly when
// the dtype has one, and writing the viewable tensors and the metadata back gives a file that
// opens with the same contents.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/safetensors.hpp"

namespace {

using namespace moekit;

// Reads every byte, so that a span or view reaching outside the input trips ASan.
uint8_t fold(const uint8_t* bytes, size_t size) {
  uint8_t sum = 0;
  for (size_t i = 0; i < size; ++i) sum = static_cast<uint8_t>(sum + bytes[i]);
  return sum;
}

void check_entries_tile_the_input(const SafetensorsFile& file, size_t size) {
  const std::vector<SafetensorsEntry>& entries = file.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    const SafetensorsEntry& entry = entries[i];
    if (entry.begin < 8 || entry.end < entry.begin || entry.end > static_cast<int64_t>(size)) {
      __builtin_trap();
    }
    if (i > 0 && entry.begin != entries[i - 1].end) __builtin_trap();
    if (file.find(entry.name) != &entry) __builtin_trap();
  }
  if (!entries.empty() && entries.back().end != static_cast<int64_t>(size)) __builtin_trap();
}

void check_round_trip(const SafetensorsFile& file,
                      const std::vector<std::pair<std::string, TensorView>>& views) {
  const SafetensorsFile again =
      SafetensorsFile::from_bytes(encode_safetensors(views, file.metadata()), "re-encoded");
  if (again.metadata() != file.metadata() || again.entries().size() != views.size()) {
    __builtin_trap();
  }
  for (const auto& [name, view] : views) {
    const TensorView got = again.view(name);
    if (got.dtype != view.dtype || !(got.shape == view.shape)) __builtin_trap();
    const auto size = static_cast<size_t>(view.nbytes());
    if (size > 0 && std::memcmp(got.data, view.data, size) != 0) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<SafetensorsFile> file;
  try {
    file.emplace(SafetensorsFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz"));
  } catch (const Error& e) {
    if (e.code() != Errc::invalid_argument) __builtin_trap();
    return 0;
  }
  check_entries_tile_the_input(*file, size);

  volatile uint8_t sink = 0;
  std::vector<std::pair<std::string, TensorView>> views;
  for (const SafetensorsEntry& entry : file->entries()) {
    const std::span<const uint8_t> bytes = file->bytes(entry.name);
    if (static_cast<int64_t>(bytes.size()) != entry.nbytes()) __builtin_trap();
    sink = static_cast<uint8_t>(sink + fold(bytes.data(), bytes.size()));
    TensorView view;
    try {
      view = file->view(entry.name);
    } catch (const Error& e) {
      if (e.code() != Errc::invalid_argument) __builtin_trap();
      continue;
    }
    if (view.nbytes() != entry.nbytes() || !view.is_contiguous()) __builtin_trap();
    sink = static_cast<uint8_t>(
        sink + fold(static_cast<const uint8_t*>(view.data), static_cast<size_t>(view.nbytes())));
    views.emplace_back(entry.name, view);
  }
  check_round_trip(*file, views);
  return 0;
}
