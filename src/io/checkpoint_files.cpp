#include "moekit/checkpoint_files.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

#include "io/strict_json.hpp"
#include "moekit/error.hpp"

namespace moekit {

namespace fs = std::filesystem;

struct CheckpointFiles::Shard {
  std::string path;
  // Names the index puts in this shard, checked when it opens; empty without an index.
  std::vector<std::string> listed;
  std::mutex mutex;
  std::optional<SafetensorsFile> file;
};

namespace {

using nlohmann::json;

// The index holds only a flat map and a small metadata object; deeper nesting is not an index.
constexpr int kMaxIndexDepth = 8;

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(Errc::io, "cannot read '{}': {}", path.string(), std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(Errc::io, "cannot read '{}': {}", path.string(), std::strerror(errno));
  return text;
}

// A shard must be a plain file name inside the directory: a separator or a dot-dot would let an
// index downloaded with a model point at any file on the machine.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string_view("/\\\0", 3)) == std::string::npos;
}

// tensor name -> shard file name, from the index's weight_map.
std::map<std::string, std::string> read_weight_map(const fs::path& index_path) {
  const std::string label = fmt::format("checkpoint index '{}'", index_path.string());
  const json root = io::parse_strict_json(read_text_file(index_path), label, kMaxIndexDepth);
  if (!root.is_object()) fail(Errc::invalid_argument, "{}: not a JSON object", label);
  const auto weight_map = root.find("weight_map");
  if (weight_map == root.end()) fail(Errc::invalid_argument, "{}: has no 'weight_map'", label);
  if (!weight_map->is_object()) {
    fail(Errc::invalid_argument, "{}: 'weight_map' is not an object", label);
  }
  std::map<std::string, std::string> shard_of;
  for (const auto& [tensor, file] : weight_map->items()) {
    if (!file.is_string()) {
      fail(Errc::invalid_argument, "{}: weight_map entry '{}' is {}, not a file name", label,
           tensor, file.dump(-1, ' ', false, json::error_handler_t::replace));
    }
    const std::string& name = file.get_ref<const std::string&>();
    if (!is_plain_file_name(name)) {
      fail(Errc::invalid_argument,
           "{}: weight_map entry '{}' names shard '{}', which is not a file name inside the "
           "directory",
           label, tensor, name);
    }
    shard_of.emplace(tensor, name);
  }
  return shard_of;
}

bool is_file(const fs::path& path) {
  std::error_code error;
  return fs::is_regular_file(path, error);
}

}  // namespace

CheckpointFiles::CheckpointFiles(CheckpointFiles&& other) noexcept = default;
CheckpointFiles& CheckpointFiles::operator=(CheckpointFiles&& other) noexcept = default;
CheckpointFiles::~CheckpointFiles() = default;

CheckpointFiles CheckpointFiles::open(const std::string& directory) {
  std::error_code error;
  if (!fs::is_directory(directory, error)) {
    fail(Errc::io, "checkpoint directory '{}' is not a readable directory{}", directory,
         error ? ": " + error.message() : std::string());
  }
  CheckpointFiles files;
  files.directory_ = directory;
  const fs::path root(directory);

  const auto add_shard = [&](const fs::path& path) {
    auto shard = std::make_unique<Shard>();
    shard->path = path.string();
    files.shards_.push_back(std::move(shard));
    return files.shards_.size() - 1;
  };

  if (const fs::path index_path = root / kCheckpointIndexFile; fs::exists(index_path, error)) {
    std::map<std::string, size_t> shard_by_file;
    for (auto& [tensor, file] : read_weight_map(index_path)) {
      auto [slot, added] = shard_by_file.emplace(file, 0);
      if (added) {
        const fs::path path = root / file;
        if (!is_file(path)) {
          fail(Errc::io, "checkpoint index '{}' names shard '{}', which is not a file in '{}'",
               index_path.string(), file, directory);
        }
        slot->second = add_shard(path);
      }
      files.shards_[slot->second]->listed.push_back(tensor);
      files.shard_of_.emplace(tensor, slot->second);
    }
    return files;
  }

  std::vector<fs::path> paths;
  if (const fs::path single = root / kCheckpointSingleFile; is_file(single)) {
    paths.push_back(single);
  } else {
    for (fs::directory_iterator it(root, error), end; !error && it != end; it.increment(error)) {
      if (it->path().extension() == ".safetensors" && is_file(it->path())) {
        paths.push_back(it->path());
      }
    }
    if (error) {
      fail(Errc::io, "cannot list checkpoint directory '{}': {}", directory, error.message());
    }
    std::sort(paths.begin(), paths.end());
  }
  if (paths.empty()) {
    fail(Errc::io, "checkpoint directory '{}' has no {}, no {} and no *.safetensors file",
         directory, kCheckpointIndexFile, kCheckpointSingleFile);
  }
  for (const fs::path& path : paths) {
    const size_t index = add_shard(path);
    Shard& shard = *files.shards_[index];
    shard.file = SafetensorsFile::open(shard.path);
    for (const SafetensorsEntry& entry : shard.file->entries()) {
      const auto [existing, added] = files.shard_of_.emplace(entry.name, index);
      if (!added) {
        fail(Errc::invalid_argument,
             "checkpoint directory '{}' has no index, and tensor '{}' is in both '{}' and '{}'",
             directory, entry.name, files.shards_[existing->second]->path, shard.path);
      }
    }
  }
  return files;
}

size_t CheckpointFiles::shard_index(std::string_view name) const {
  const auto found = shard_of_.find(name);
  if (found == shard_of_.end()) {
    fail(Errc::invalid_argument, "checkpoint directory '{}' has no tensor named '{}'", directory_,
         name);
  }
  return found->second;
}

const SafetensorsFile& CheckpointFiles::shard(size_t index) const {
  Shard& shard = *shards_[index];
  const std::lock_guard lock(shard.mutex);
  if (!shard.file) {
    SafetensorsFile file = SafetensorsFile::open(shard.path);
    for (const std::string& name : shard.listed) {
      if (file.find(name) == nullptr) {
        fail(Errc::invalid_argument,
             "checkpoint index '{}' puts tensor '{}' in shard '{}', which has no such tensor",
             (fs::path(directory_) / kCheckpointIndexFile).string(), name, shard.path);
      }
    }
    shard.file = std::move(file);
  }
  return *shard.file;
}

bool CheckpointFiles::contains(std::string_view name) const {
  return shard_of_.find(name) != shard_of_.end();
}

TensorView CheckpointFiles::view(std::string_view name) const {
  return shard(shard_index(name)).view(name);
}

std::span<const uint8_t> CheckpointFiles::bytes(std::string_view name) const {
  return shard(shard_index(name)).bytes(name);
}

const SafetensorsEntry& CheckpointFiles::entry(std::string_view name) const {
  return *shard(shard_index(name)).find(name);
}

std::vector<std::string> CheckpointFiles::names() const {
  std::vector<std::string> names;
  names.reserve(shard_of_.size());
  for (const auto& [name, index] : shard_of_) names.push_back(name);
  return names;
}

std::string CheckpointFiles::file_of(std::string_view name) const {
  return shards_[shard_index(name)]->path;
}

}  // namespace moekit
