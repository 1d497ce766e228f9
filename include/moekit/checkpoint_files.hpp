#pragma once
// The tensors of a Hugging Face model directory, across its safetensors shards.
//
// Which files hold the tensors: model.safetensors.index.json when present (its "weight_map"
// names each tensor's shard); else model.safetensors; else every *.safetensors file of the
// directory, where a tensor in two files is an error. Shards named by an index are opened on
// first use, once, and checked then to hold every tensor the index gives them; without an index
// every shard is opened up front, since that is the only way to learn its names. Lookups are safe
// from several threads. Views are read-only like those of SafetensorsFile.

#include <cstddef>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/safetensors.hpp"

namespace moekit {

inline constexpr std::string_view kCheckpointIndexFile = "model.safetensors.index.json";
inline constexpr std::string_view kCheckpointSingleFile = "model.safetensors";

class CheckpointFiles {
 public:
  // Throws Error(io) when the directory, the index or a shard cannot be read or is missing,
  // Error(invalid_argument) when the index or a shard opened here is malformed: the message names
  // the file and the fault.
  static CheckpointFiles open(const std::string& directory);

  CheckpointFiles(CheckpointFiles&& other) noexcept;
  CheckpointFiles& operator=(CheckpointFiles&& other) noexcept;
  CheckpointFiles(const CheckpointFiles&) = delete;
  CheckpointFiles& operator=(const CheckpointFiles&) = delete;
  ~CheckpointFiles();

  const std::string& directory() const { return directory_; }
  bool contains(std::string_view name) const;
  // As SafetensorsFile::view and bytes; an unknown name fails naming it and the directory.
  TensorView view(std::string_view name) const;
  std::span<const uint8_t> bytes(std::string_view name) const;
  // The tensor's dtype name, shape and offsets, from its shard's header alone.
  const SafetensorsEntry& entry(std::string_view name) const;
  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  // The path of the shard that holds the tensor (directory joined with the file name).
  std::string file_of(std::string_view name) const;

 private:
  struct Shard;
  CheckpointFiles() = default;
  size_t shard_index(std::string_view name) const;
  const SafetensorsFile& shard(size_t index) const;

  std::string directory_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::map<std::string, size_t, std::less<>> shard_of_;  // tensor name -> index into shards_
};

}  // namespace moekit
