#include "moekit/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "io/strict_json.hpp"
#include "moekit/error.hpp"

namespace moekit {

// Tensor bytes are little-endian in the file and are handed out without conversion.
static_assert(std::endian::native == std::endian::little, "safetensors views assume little-endian");

namespace {

using nlohmann::json;

constexpr size_t kLengthBytes = 8;
// Root object, tensor entry, shape list; one level more lets a nested shape reach the shape check
// and be reported as a bad shape rather than as deep nesting.
constexpr int kMaxHeaderDepth = 3;
constexpr std::string_view kMetadataKey = "__metadata__";

struct SafetensorsDType {
  std::string_view name;
  int bits;
  std::optional<DType> moekit;
};

// Every dtype of the format, including the microscaling ones (F8_E8M0 scales, F4 and F6 packed
// values) that recent checkpoints carry, so their files open and their bytes can be read.
constexpr SafetensorsDType kDTypes[] = {
    {"BOOL", 8, std::nullopt},    {"U8", 8, std::nullopt},      {"I8", 8, DType::i8},
    {"I16", 16, std::nullopt},    {"U16", 16, std::nullopt},    {"F16", 16, DType::f16},
    {"BF16", 16, DType::bf16},    {"I32", 32, DType::i32},      {"U32", 32, std::nullopt},
    {"F32", 32, DType::f32},      {"I64", 64, std::nullopt},    {"U64", 64, std::nullopt},
    {"F64", 64, std::nullopt},    {"C64", 64, std::nullopt},    {"F8_E4M3", 8, DType::f8e4m3},
    {"F8_E5M2", 8, std::nullopt}, {"F8_E8M0", 8, std::nullopt}, {"F4", 4, std::nullopt},
    {"F6_E2M3", 6, std::nullopt}, {"F6_E3M2", 6, std::nullopt},
};

const SafetensorsDType* find_dtype(std::string_view name) {
  for (const SafetensorsDType& dtype : kDTypes) {
    if (dtype.name == name) return &dtype;
  }
  return nullptr;
}

std::string readable_dtypes() {
  std::string names;
  for (const SafetensorsDType& dtype : kDTypes) {
    if (dtype.moekit) names += fmt::format("{}{}", names.empty() ? "" : ", ", dtype.name);
  }
  return names;
}

template <typename... Args>
[[noreturn]] void invalid(std::string_view label, fmt::format_string<Args...> format,
                          Args&&... args) {
  fail(Errc::invalid_argument, "safetensors file '{}': {}", label,
       fmt::format(format, std::forward<Args>(args)...));
}

std::string errno_text() {
  return std::strerror(errno);
}

std::optional<int64_t> non_negative_integer(const json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t n = value.get<uint64_t>();
    if (n <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return static_cast<int64_t>(n);
    }
  }
  return std::nullopt;
}

std::string clipped_dump(const json& value) {
  constexpr size_t kMaxShown = 60;
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > kMaxShown) text = text.substr(0, kMaxShown) + "...";
  return text;
}

Shape parse_shape(const json& value, std::string_view label, const std::string& name) {
  if (!value.is_array()) {
    invalid(label, "tensor '{}': shape {} is not a list of integers", name, clipped_dump(value));
  }
  if (value.size() > static_cast<size_t>(kMaxRank)) {
    invalid(label, "tensor '{}': shape {} has rank {}, and moekit handles at most {} dimensions",
            name, clipped_dump(value), value.size(), kMaxRank);
  }
  Shape shape;
  for (const json& dim : value) {
    const std::optional<int64_t> size = non_negative_integer(dim);
    if (!size) {
      invalid(label, "tensor '{}': shape {} is not a list of non-negative integers", name,
              clipped_dump(value));
    }
    shape.dims[shape.rank++] = *size;
  }
  return shape;
}

// Bytes that `shape` elements of `dtype` occupy. A packed sub-byte tensor must end on a byte
// boundary: the spare bits of a last partial byte have no agreed meaning, and the reference
// implementation refuses such tensors too.
int64_t storage_bytes(const Shape& shape, const SafetensorsDType& dtype, std::string_view label,
                      const std::string& name) {
  int64_t total_bits = dtype.bits;
  for (int axis = 0; axis < shape.rank; ++axis) {
    if (__builtin_mul_overflow(total_bits, shape[axis], &total_bits)) {
      invalid(label, "tensor '{}': shape {} has more elements than a file can hold", name,
              shape.str());
    }
  }
  if (total_bits % 8 != 0) {
    invalid(label, "tensor '{}': {}{} is {} bits, not a whole number of bytes", name, dtype.name,
            shape.str(), total_bits);
  }
  return total_bits / 8;
}

SafetensorsEntry parse_entry(const std::string& name, const json& value, std::string_view label,
                             int64_t data_begin, int64_t data_bytes) {
  if (!value.is_object()) {
    invalid(label, "tensor '{}': entry {} is not an object", name, clipped_dump(value));
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) invalid(label, "tensor '{}': entry has no '{}'", name, key);
  }
  if (value.size() != 3) {
    for (const auto& [key, ignored] : value.items()) {
      if (key != "dtype" && key != "shape" && key != "data_offsets") {
        invalid(label, "tensor '{}': entry has an unexpected key '{}'", name, key);
      }
    }
  }
  const json& dtype_value = value["dtype"];
  if (!dtype_value.is_string()) {
    invalid(label, "tensor '{}': dtype {} is not a string", name, clipped_dump(dtype_value));
  }
  const SafetensorsDType* dtype = find_dtype(dtype_value.get_ref<const std::string&>());
  if (dtype == nullptr) {
    invalid(label, "tensor '{}': unknown dtype {}", name, clipped_dump(dtype_value));
  }
  SafetensorsEntry entry;
  entry.name = name;
  entry.dtype_name = dtype->name;
  entry.element_bits = dtype->bits;
  entry.shape = parse_shape(value["shape"], label, name);

  const json& offsets = value["data_offsets"];
  std::optional<int64_t> begin;
  std::optional<int64_t> end;
  if (offsets.is_array() && offsets.size() == 2) {
    begin = non_negative_integer(offsets[0]);
    end = non_negative_integer(offsets[1]);
  }
  if (!begin || !end) {
    invalid(label, "tensor '{}': data_offsets {} is not two non-negative integers", name,
            clipped_dump(offsets));
  }
  if (*begin > *end) {
    invalid(label, "tensor '{}': data_offsets [{}, {}] begin after they end", name, *begin, *end);
  }
  if (*end > data_bytes) {
    invalid(label, "tensor '{}': data_offsets [{}, {}] run past the data section of {} bytes", name,
            *begin, *end, data_bytes);
  }
  const int64_t expected = storage_bytes(entry.shape, *dtype, label, name);
  if (*end - *begin != expected) {
    invalid(label, "tensor '{}': data_offsets [{}, {}] hold {} bytes, but {}{} needs {}", name,
            *begin, *end, *end - *begin, dtype->name, entry.shape.str(), expected);
  }
  entry.begin = data_begin + *begin;
  entry.end = data_begin + *end;
  return entry;
}

std::map<std::string, std::string> parse_metadata(const json& value, std::string_view label) {
  if (!value.is_object()) {
    invalid(label, "__metadata__ {} is not an object", clipped_dump(value));
  }
  std::map<std::string, std::string> metadata;
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      invalid(label, "__metadata__ value of '{}' is {}, not a string", key, clipped_dump(item));
    }
    metadata.emplace(key, item.get<std::string>());
  }
  return metadata;
}

// The reference implementation requires the tensors to tile the data section exactly; a hole or
// an overlap means the header and the data disagree, so both are refused.
void check_tiling(std::vector<SafetensorsEntry>& entries, std::string_view label,
                  int64_t data_begin, int64_t data_bytes) {
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  int64_t covered = data_begin;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& entry : entries) {
    if (entry.begin < covered) {
      invalid(label, "tensor '{}' (data bytes [{}, {})) overlaps tensor '{}' (data bytes [{}, {}))",
              entry.name, entry.begin - data_begin, entry.end - data_begin, previous->name,
              previous->begin - data_begin, previous->end - data_begin);
    }
    if (entry.begin > covered) {
      invalid(label, "data bytes [{}, {}) belong to no tensor (holes are not allowed)",
              covered - data_begin, entry.begin - data_begin);
    }
    covered = entry.end;
    previous = &entry;
  }
  if (covered != data_begin + data_bytes) {
    invalid(label, "data bytes [{}, {}) belong to no tensor (holes are not allowed)",
            covered - data_begin, data_bytes);
  }
}

struct ParsedHeader {
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
};

ParsedHeader parse_file(const uint8_t* data, size_t size, std::string_view label) {
  if (size < kLengthBytes) {
    invalid(label, "the file has {} bytes, fewer than the 8 of the header length", size);
  }
  uint64_t header_bytes = 0;
  for (size_t i = 0; i < kLengthBytes; ++i) header_bytes |= uint64_t{data[i]} << (8 * i);
  if (header_bytes == 0) invalid(label, "the header length is 0");
  if (header_bytes > static_cast<uint64_t>(kSafetensorsMaxHeaderBytes)) {
    invalid(label, "the header length {} is over the limit of {} bytes", header_bytes,
            kSafetensorsMaxHeaderBytes);
  }
  if (header_bytes > size - kLengthBytes) {
    invalid(label, "the header length {} runs past the end of the file ({} bytes)", header_bytes,
            size);
  }
  const std::string_view header(reinterpret_cast<const char*>(data) + kLengthBytes,
                                static_cast<size_t>(header_bytes));
  if (const size_t bad = io::first_invalid_utf8(header); bad != std::string_view::npos) {
    invalid(label, "the header is not valid UTF-8 (byte {} of the header)", bad);
  }
  // With this, JSON that parses is an object.
  if (header.front() != '{') {
    invalid(label, "the header does not start with '{{' (it must be a JSON object)");
  }
  // The JSON may be followed by whitespace, which writers add to align the data section.
  const json root =
      io::parse_strict_json(header, fmt::format("safetensors file '{}'", label), kMaxHeaderDepth);

  const auto data_begin = static_cast<int64_t>(kLengthBytes + header_bytes);
  const auto data_bytes = static_cast<int64_t>(size) - data_begin;
  ParsedHeader parsed;
  for (const auto& [key, value] : root.items()) {
    if (key == kMetadataKey) {
      parsed.metadata = parse_metadata(value, label);
    } else {
      parsed.entries.push_back(parse_entry(key, value, label, data_begin, data_bytes));
    }
  }
  check_tiling(parsed.entries, label, data_begin, data_bytes);
  return parsed;
}

}  // namespace

class SafetensorsFile::Storage {
 public:
  static std::unique_ptr<Storage> owning(std::vector<uint8_t> bytes) {
    auto storage = std::unique_ptr<Storage>(new Storage);
    storage->owned_ = std::move(bytes);
    storage->data_ = storage->owned_.data();
    storage->size_ = storage->owned_.size();
    return storage;
  }

  static std::unique_ptr<Storage> mapped(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(Errc::io, "cannot open safetensors file '{}': {}", path, errno_text());
    struct stat info {};
    if (::fstat(fd, &info) != 0) {
      const std::string reason = errno_text();
      ::close(fd);
      fail(Errc::io, "cannot stat safetensors file '{}': {}", path, reason);
    }
    if (!S_ISREG(info.st_mode)) {
      ::close(fd);
      fail(Errc::io, "safetensors file '{}' is not a regular file", path);
    }
    auto storage = std::unique_ptr<Storage>(new Storage);
    // mmap refuses a length of 0; an empty file is left empty for validation to refuse.
    if (info.st_size > 0) {
      const auto size = static_cast<size_t>(info.st_size);
      void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (mapping == MAP_FAILED) {
        const std::string reason = errno_text();
        ::close(fd);
        fail(Errc::io, "cannot map safetensors file '{}' ({} bytes): {}", path, size, reason);
      }
      storage->mapping_ = mapping;
      storage->data_ = static_cast<const uint8_t*>(mapping);
      storage->size_ = size;
    }
    ::close(fd);
    return storage;
  }

  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (mapping_ != nullptr) ::munmap(mapping_, size_);
  }

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  Storage() = default;

  std::vector<uint8_t> owned_;
  void* mapping_ = nullptr;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

SafetensorsFile::SafetensorsFile(std::unique_ptr<Storage> storage, std::string path)
    : storage_(std::move(storage)), path_(std::move(path)) {
  ParsedHeader parsed = parse_file(storage_->data(), storage_->size(), path_);
  entries_ = std::move(parsed.entries);
  metadata_ = std::move(parsed.metadata);
  for (size_t i = 0; i < entries_.size(); ++i) by_name_.emplace(entries_[i].name, i);
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  return SafetensorsFile(Storage::mapped(path), path);
}

SafetensorsFile SafetensorsFile::from_bytes(std::vector<uint8_t> bytes, std::string label) {
  return SafetensorsFile(Storage::owning(std::move(bytes)), std::move(label));
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  const auto found = by_name_.find(name);
  return found == by_name_.end() ? nullptr : &entries_[found->second];
}

const SafetensorsEntry& SafetensorsFile::entry_or_fail(std::string_view name) const {
  const SafetensorsEntry* entry = find(name);
  if (entry == nullptr) {
    fail(Errc::invalid_argument, "safetensors file '{}' has no tensor named '{}'", path_, name);
  }
  return *entry;
}

std::span<const uint8_t> SafetensorsFile::bytes(std::string_view name) const {
  const SafetensorsEntry& entry = entry_or_fail(name);
  return {storage_->data() + entry.begin, static_cast<size_t>(entry.nbytes())};
}

TensorView SafetensorsFile::view(std::string_view name) const {
  const SafetensorsEntry& entry = entry_or_fail(name);
  const SafetensorsDType* dtype = find_dtype(entry.dtype_name);
  if (!dtype->moekit) {
    fail(Errc::invalid_argument,
         "tensor '{}' in safetensors file '{}' has dtype {}, which moekit has no DType for "
         "(views exist for {}; bytes() reads any tensor)",
         name, path_, entry.dtype_name, readable_dtypes());
  }
  const uint8_t* data = storage_->data() + entry.begin;
  const auto element_bytes = static_cast<uintptr_t>(dtype->bits / 8);
  if (entry.nbytes() > 0 && reinterpret_cast<uintptr_t>(data) % element_bytes != 0) {
    fail(Errc::invalid_argument,
         "tensor '{}' in safetensors file '{}' starts at byte {}, not aligned to its {}-byte "
         "elements, so it cannot be viewed in place (bytes() can copy it)",
         name, path_, entry.begin, element_bytes);
  }
  // Read-only by contract (see the header): TensorView has no const data pointer.
  return TensorView::contiguous(const_cast<uint8_t*>(data), *dtype->moekit, entry.shape);
}

std::string_view safetensors_dtype_name(DType dtype) {
  for (const SafetensorsDType& candidate : kDTypes) {
    if (candidate.moekit == dtype) return candidate.name;
  }
  fail(Errc::invalid_argument, "dtype {} has no safetensors name", dtype_name(dtype));
}

namespace {

struct PlannedTensor {
  const std::string* name;
  const TensorView* view;
};

struct EncodedLayout {
  std::string header;  // padded so that the data section starts 8-byte aligned
  std::vector<PlannedTensor> order;
};

EncodedLayout plan_layout(const std::vector<std::pair<std::string, TensorView>>& tensors,
                          const std::map<std::string, std::string>& metadata,
                          std::string_view label) {
  const auto check_text = [&](std::string_view what, const std::string& text) {
    if (io::first_invalid_utf8(text) != std::string_view::npos) {
      fail(Errc::invalid_argument, "writing safetensors file '{}': {} is not valid UTF-8", label,
           what);
    }
  };
  EncodedLayout layout;
  std::set<std::string_view> names;
  for (const auto& tensor : tensors) {
    // Named references rather than a structured binding: clang 14 cannot capture those.
    const std::string& name = tensor.first;
    const TensorView& view = tensor.second;
    check_text("a tensor name", name);
    const auto refuse = [&](std::string_view why) {
      fail(Errc::invalid_argument, "writing safetensors file '{}': tensor '{}' ({}) {}", label,
           name, view.describe(), why);
    };
    if (name == kMetadataKey) refuse("uses the name reserved for metadata");
    if (!names.insert(name).second) refuse("has the name of another tensor");
    if (view.device.kind != DeviceKind::cpu) refuse("is not on the CPU");
    if (view.dtype == DType::i4) refuse("is i4, which safetensors has no dtype for");
    for (int axis = 0; axis < view.rank(); ++axis) {
      if (view.dim(axis) < 0) refuse("has a negative dimension");
    }
    if (!view.is_contiguous()) refuse("is not contiguous");
    if (view.data == nullptr && view.nbytes() > 0) refuse("has no data");
    layout.order.push_back({&name, &view});
  }
  // Largest elements first keeps every tensor aligned to its element size, as each tensor's
  // size is a multiple of its element size and the data section starts 8-byte aligned.
  std::stable_sort(layout.order.begin(), layout.order.end(), [](const auto& a, const auto& b) {
    return dtype_bits(a.view->dtype) > dtype_bits(b.view->dtype);
  });

  json header = json::object();
  int64_t offset = 0;
  for (const PlannedTensor& tensor : layout.order) {
    json shape = json::array();
    for (int axis = 0; axis < tensor.view->rank(); ++axis) shape.push_back(tensor.view->dim(axis));
    const int64_t end = offset + tensor.view->nbytes();
    header[*tensor.name] = {{"dtype", safetensors_dtype_name(tensor.view->dtype)},
                            {"shape", std::move(shape)},
                            {"data_offsets", {offset, end}}};
    offset = end;
  }
  if (!metadata.empty()) {
    json& items = header[std::string(kMetadataKey)] = json::object();
    for (const auto& [key, value] : metadata) {
      check_text("a metadata key", key);
      check_text(fmt::format("the metadata value of '{}'", key), value);
      items[key] = value;
    }
  }
  layout.header = header.dump();
  layout.header.append((kLengthBytes - layout.header.size() % kLengthBytes) % kLengthBytes, ' ');
  return layout;
}

std::array<uint8_t, kLengthBytes> encode_length(size_t length) {
  std::array<uint8_t, kLengthBytes> bytes{};
  for (size_t i = 0; i < kLengthBytes; ++i) bytes[i] = static_cast<uint8_t>(length >> (8 * i));
  return bytes;
}

// Closes on every path, so an error while writing does not leak the stream.
struct OutputFile {
  std::FILE* stream = nullptr;
  ~OutputFile() {
    if (stream != nullptr) std::fclose(stream);
  }
};

}  // namespace

std::vector<uint8_t> encode_safetensors(
    const std::vector<std::pair<std::string, TensorView>>& tensors,
    const std::map<std::string, std::string>& metadata) {
  const EncodedLayout layout = plan_layout(tensors, metadata, "<memory>");
  size_t total = kLengthBytes + layout.header.size();
  for (const PlannedTensor& tensor : layout.order)
    total += static_cast<size_t>(tensor.view->nbytes());
  std::vector<uint8_t> bytes(total);
  size_t offset = 0;
  const auto put = [&](const void* data, size_t size) {
    if (size > 0) std::memcpy(bytes.data() + offset, data, size);
    offset += size;
  };
  const auto length = encode_length(layout.header.size());
  put(length.data(), length.size());
  put(layout.header.data(), layout.header.size());
  for (const PlannedTensor& tensor : layout.order) {
    put(tensor.view->data, static_cast<size_t>(tensor.view->nbytes()));
  }
  return bytes;
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const EncodedLayout layout = plan_layout(tensors, metadata, path);
  const std::string partial = path + ".partial";
  const auto write_failed = [&](std::string_view step) {
    const std::string reason = errno_text();
    std::remove(partial.c_str());
    fail(Errc::io, "cannot write safetensors file '{}' ({} '{}'): {}", path, step, partial, reason);
  };
  {
    OutputFile out{std::fopen(partial.c_str(), "wb")};
    if (out.stream == nullptr) write_failed("creating");
    const auto put = [&](const void* data, size_t size) {
      if (size > 0 && std::fwrite(data, 1, size, out.stream) != size) write_failed("writing");
    };
    const auto length = encode_length(layout.header.size());
    put(length.data(), length.size());
    put(layout.header.data(), layout.header.size());
    for (const PlannedTensor& tensor : layout.order) {
      put(tensor.view->data, static_cast<size_t>(tensor.view->nbytes()));
    }
    const int closed = std::fclose(std::exchange(out.stream, nullptr));
    if (closed != 0) write_failed("closing");
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) write_failed("renaming");
}

}  // namespace moekit
