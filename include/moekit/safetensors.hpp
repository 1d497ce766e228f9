#pragma once
// Safetensors files (the Hugging Face checkpoint format): an 8-byte little-endian header length
// N, N bytes of JSON naming each tensor's dtype, shape and byte range, then the tensor data.
//
// Reading validates the whole header up front, the way the reference implementation does: every
// field's type, known dtypes, sizes that match shapes, and byte ranges that tile the data section
// exactly (no overlaps, no holes, nothing past the end). After that, views and byte spans cannot
// reach outside the file.
//
// Views returned by SafetensorsFile are zero-copy and read-only. TensorView exposes a `void*`,
// but the bytes behind it are a PROT_READ mapping (or a buffer the file owns and shares between
// views): writing through a view faults or corrupts other readers. Copy before modifying.

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/tensor.hpp"

namespace moekit {

// The largest JSON header accepted, as in the reference implementation: it bounds what a hostile
// header length makes the reader parse.
inline constexpr int64_t kSafetensorsMaxHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;  // as in the file: "BF16", "F8_E4M3", "U8", ...
  int element_bits = 0;    // 4 for F4, 6 for F6_*, 1 byte or more for the others
  Shape shape;
  int64_t begin = 0;  // absolute byte offsets in the file: [begin, end)
  int64_t end = 0;

  int64_t nbytes() const { return end - begin; }
};

class SafetensorsFile {
 public:
  // Maps the file read-only. Throws Error(io) naming the path when it cannot be opened, read or
  // mapped, Error(invalid_argument) naming the path and the fault when it is not a valid
  // safetensors file.
  static SafetensorsFile open(const std::string& path);
  // The same validation over bytes in memory; `label` stands in for the path in messages.
  static SafetensorsFile from_bytes(std::vector<uint8_t> bytes, std::string label);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // Sorted by data offset (zero-byte tensors at the same offset by name), which is the order
  // that reads the file front to back.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  // nullptr when the file has no tensor of that name.
  const SafetensorsEntry* find(std::string_view name) const;
  // A zero-copy contiguous CPU view (read-only, see above) for the dtypes moekit has:
  // F32 F16 BF16 F8_E4M3 (e4m3fn) I32 I8. Throws invalid_argument naming the tensor, the file and
  // the fault when the name is absent, the dtype has no moekit DType (U8 included: moekit's i8 is
  // signed, and packed formats stored as U8 need their own reading; use bytes()), or the data is
  // not aligned to its element size.
  TensorView view(std::string_view name) const;
  // The raw bytes of any tensor, whatever its dtype. Throws invalid_argument when absent.
  std::span<const uint8_t> bytes(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  class Storage;
  SafetensorsFile(std::unique_ptr<Storage> storage, std::string path);
  const SafetensorsEntry& entry_or_fail(std::string_view name) const;

  std::unique_ptr<Storage> storage_;
  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t, std::less<>> by_name_;  // index into entries_
  std::map<std::string, std::string> metadata_;
};

// The safetensors dtype name of a moekit dtype ("F32", "BF16", ...); throws invalid_argument for
// i4, which safetensors cannot name.
std::string_view safetensors_dtype_name(DType dtype);

// A safetensors file holding `tensors` (contiguous CPU views of any dtype but i4, distinct names)
// and `metadata`. Tensors are laid out by element size, largest first, after a header padded to 8
// bytes, so every tensor is aligned for zero-copy reading. The file is written next to `path`
// and renamed into place, so a failed write leaves no partial file under that name. Throws
// invalid_argument for unusable tensors, io (with path and reason) when writing fails.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// The same file as bytes in memory.
std::vector<uint8_t> encode_safetensors(
    const std::vector<std::pair<std::string, TensorView>>& tensors,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace moekit
