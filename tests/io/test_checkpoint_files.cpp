#include "moekit/checkpoint_files.hpp"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "io/io_test_support.hpp"
#include "moekit/error.hpp"
#include "moekit/safetensors.hpp"
#include "moekit/tensor.hpp"

namespace moekit {
namespace {

using io_test::error_message;
using io_test::ScratchDir;
using io_test::write_file;

// Writes a shard whose tensors are int8 vectors [n] filled with `fill`, so that each tensor's
// contents say which shard it came from.
void write_shard(const ScratchDir& dir, const std::string& file,
                 const std::vector<std::string>& names, int8_t fill) {
  std::vector<std::vector<int8_t>> storage;
  std::vector<std::pair<std::string, TensorView>> views;
  for (size_t i = 0; i < names.size(); ++i) {
    storage.emplace_back(i + 1, fill);
  }
  for (size_t i = 0; i < names.size(); ++i) {
    views.emplace_back(names[i], TensorView::contiguous(storage[i].data(), DType::i8,
                                                        {static_cast<int64_t>(i + 1)}));
  }
  write_safetensors(dir.file(file), views);
}

void write_index(const ScratchDir& dir, const std::string& weight_map) {
  write_file(dir.file(kCheckpointIndexFile),
             R"({"metadata":{"total_size":6},"weight_map":)" + weight_map + "}");
}

// Two shards and the index that names them: a and b in the first, c in the second.
void write_indexed_checkpoint(const ScratchDir& dir) {
  write_shard(dir, "model-00001-of-00002.safetensors", {"a", "b"}, 1);
  write_shard(dir, "model-00002-of-00002.safetensors", {"c"}, 2);
  write_index(dir, R"({"a":"model-00001-of-00002.safetensors",)"
                   R"("b":"model-00001-of-00002.safetensors",)"
                   R"("c":"model-00002-of-00002.safetensors"})");
}

int8_t first_value(const CheckpointFiles& files, const std::string& name) {
  return files.view(name).as<int8_t>()[0];
}

TEST(CheckpointFiles, IndexMapsEachTensorToItsShard) {
  ScratchDir dir;
  write_indexed_checkpoint(dir);
  const CheckpointFiles files = CheckpointFiles::open(dir.path().string());
  EXPECT_EQ(files.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(files.file_of("b"), dir.file("model-00001-of-00002.safetensors"));
  EXPECT_EQ(files.file_of("c"), dir.file("model-00002-of-00002.safetensors"));
  EXPECT_EQ(first_value(files, "a"), 1);
  EXPECT_EQ(first_value(files, "c"), 2);
  EXPECT_TRUE(files.contains("b"));
  EXPECT_FALSE(files.contains("d"));
}

TEST(CheckpointFiles, EntryGivesDtypeAndShape) {
  ScratchDir dir;
  write_indexed_checkpoint(dir);
  const CheckpointFiles files = CheckpointFiles::open(dir.path().string());
  const SafetensorsEntry& entry = files.entry("b");
  EXPECT_EQ(entry.dtype_name, "I8");
  EXPECT_EQ(entry.shape, Shape({2}));
  EXPECT_EQ(files.bytes("b").size(), 2u);
}

TEST(CheckpointFiles, IndexedShardOpensOnlyWhenOneOfItsTensorsIsRead) {
  ScratchDir dir;
  write_indexed_checkpoint(dir);
  write_file(dir.file("model-00002-of-00002.safetensors"), "not a safetensors file");
  const CheckpointFiles files = CheckpointFiles::open(dir.path().string());
  EXPECT_EQ(first_value(files, "a"), 1);
  const std::string message = error_message([&] { (void)files.view("c"); }, Errc::invalid_argument);
  EXPECT_NE(message.find("model-00002-of-00002.safetensors"), std::string::npos) << message;
}

TEST(CheckpointFiles, UnknownTensorNamesTensorAndDirectory) {
  ScratchDir dir;
  write_indexed_checkpoint(dir);
  const CheckpointFiles files = CheckpointFiles::open(dir.path().string());
  for (const auto& read : {std::function<void()>([&] { (void)files.view("mlp.w"); }),
                           std::function<void()>([&] { (void)files.entry("mlp.w"); }),
                           std::function<void()>([&] { (void)files.file_of("mlp.w"); })}) {
    const std::string message = error_message(read, Errc::invalid_argument);
    EXPECT_NE(message.find("'mlp.w'"), std::string::npos) << message;
    EXPECT_NE(message.find(dir.path().string()), std::string::npos) << message;
  }
}

TEST(CheckpointFiles, TensorListedInIndexButAbsentFromItsShardFailsWhenRead) {
  ScratchDir dir;
  write_shard(dir, "shard.safetensors", {"a"}, 1);
  write_index(dir, R"({"a":"shard.safetensors","ghost":"shard.safetensors"})");
  const CheckpointFiles files = CheckpointFiles::open(dir.path().string());
  EXPECT_TRUE(files.contains("ghost"));
  const std::string message = error_message([&] { (void)files.view("a"); }, Errc::invalid_argument);
  EXPECT_NE(message.find("tensor 'ghost'"), std::string::npos) << message;
  EXPECT_NE(message.find("shard.safetensors"), std::string::npos) << message;
}

TEST(CheckpointFiles, SingleModelFileIsUsedWhenThereIsNoIndex) {
  ScratchDir dir;
  write_shard(dir, "model.safetensors", {"a"}, 1);
  write_shard(dir, "other.safetensors", {"a", "z"}, 2);
  const CheckpointFiles files = CheckpointFiles::open(dir.path().string());
  EXPECT_EQ(files.names(), (std::vector<std::string>{"a"}));
  EXPECT_EQ(first_value(files, "a"), 1);
}

TEST(CheckpointFiles, EveryShardIsReadWhenThereIsNoIndexNorModelFile) {
  ScratchDir dir;
  write_shard(dir, "part-1.safetensors", {"a", "b"}, 1);
  write_shard(dir, "part-2.safetensors", {"c"}, 2);
  write_file(dir.file("config.json"), "{}");
  const CheckpointFiles files = CheckpointFiles::open(dir.path().string());
  EXPECT_EQ(files.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(files.file_of("c"), dir.file("part-2.safetensors"));
  EXPECT_EQ(first_value(files, "c"), 2);
}

// The Hugging Face hub cache keeps files in blobs/ and links them from snapshots/<revision>/.
TEST(CheckpointFiles, SymlinkedFilesAsInTheHubCacheAreRead) {
  ScratchDir dir;
  std::filesystem::create_directories(dir.path() / "blobs");
  std::filesystem::create_directories(dir.path() / "snapshots" / "rev");
  write_shard(dir, "blobs/1234", {"a"}, 3);
  write_file(dir.file("blobs/5678"), R"({"weight_map":{"a":"model-00001-of-00001.safetensors"}})");
  const std::filesystem::path snapshot = dir.path() / "snapshots" / "rev";
  std::filesystem::create_symlink("../../blobs/1234",
                                  snapshot / "model-00001-of-00001.safetensors");
  std::filesystem::create_symlink("../../blobs/5678", snapshot / kCheckpointIndexFile);
  const CheckpointFiles files = CheckpointFiles::open(snapshot.string());
  EXPECT_EQ(first_value(files, "a"), 3);
}

TEST(CheckpointFiles, TensorInTwoShardsWithoutIndexIsRefused) {
  ScratchDir dir;
  write_shard(dir, "part-1.safetensors", {"a", "b"}, 1);
  write_shard(dir, "part-2.safetensors", {"b"}, 2);
  const std::string message = error_message(
      [&] { (void)CheckpointFiles::open(dir.path().string()); }, Errc::invalid_argument);
  EXPECT_NE(message.find("tensor 'b'"), std::string::npos) << message;
  EXPECT_NE(message.find("part-1.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("part-2.safetensors"), std::string::npos) << message;
}

struct BadDirectoryRow {
  const char* what;
  const char* index;  // contents of the index file; nullptr for none
  Errc code;
  const char* expected;
};

const BadDirectoryRow kBadDirectoryRows[] = {
    {"no tensor files", nullptr, Errc::io, "no *.safetensors file"},
    {"index not JSON", "{\"weight_map\":", Errc::invalid_argument, "not valid JSON"},
    {"index not an object", "[]", Errc::invalid_argument, "not a JSON object"},
    {"no weight_map", R"({"metadata":{}})", Errc::invalid_argument, "has no 'weight_map'"},
    {"weight_map a list", R"({"weight_map":["a"]})", Errc::invalid_argument,
     "'weight_map' is not an object"},
    {"shard not a string", R"({"weight_map":{"a":1}})", Errc::invalid_argument,
     "weight_map entry 'a' is 1, not a file name"},
    {"tensor listed twice", R"({"weight_map":{"a":"s.safetensors","a":"s.safetensors"}})",
     Errc::invalid_argument, "key 'a' appears twice"},
    {"shard missing", R"({"weight_map":{"a":"absent.safetensors"}})", Errc::io,
     "names shard 'absent.safetensors', which is not a file"},
    {"shard in a parent directory", R"({"weight_map":{"a":"../s.safetensors"}})",
     Errc::invalid_argument, "shard '../s.safetensors', which is not a file name inside"},
    {"shard in a subdirectory", R"({"weight_map":{"a":"sub/s.safetensors"}})",
     Errc::invalid_argument, "which is not a file name inside"},
    {"shard with a backslash", R"({"weight_map":{"a":"..\\s.safetensors"}})",
     Errc::invalid_argument, "which is not a file name inside"},
    {"shard is the parent", R"({"weight_map":{"a":".."}})", Errc::invalid_argument,
     "which is not a file name inside"},
    {"shard is an absolute path", R"({"weight_map":{"a":"/etc/passwd"}})", Errc::invalid_argument,
     "which is not a file name inside"},
    {"shard name empty", R"({"weight_map":{"a":""}})", Errc::invalid_argument,
     "which is not a file name inside"},
};

TEST(CheckpointFiles, BadDirectoriesAreRefusedNamingTheFault) {
  for (const BadDirectoryRow& row : kBadDirectoryRows) {
    SCOPED_TRACE(row.what);
    ScratchDir dir;
    std::filesystem::create_directory(dir.path() / "sub");
    write_shard(dir, "sub/s.safetensors", {"a"}, 1);
    if (row.index != nullptr) write_file(dir.file(kCheckpointIndexFile), row.index);
    const std::string message =
        error_message([&] { (void)CheckpointFiles::open(dir.path().string()); }, row.code);
    EXPECT_NE(message.find(row.expected), std::string::npos) << message;
    EXPECT_NE(message.find(dir.path().string()), std::string::npos) << message;
  }
}

TEST(CheckpointFiles, MissingDirectoryIsAnIoError) {
  ScratchDir dir;
  const std::string missing = dir.file("nowhere");
  const std::string message =
      error_message([&] { (void)CheckpointFiles::open(missing); }, Errc::io);
  EXPECT_NE(message.find(missing), std::string::npos) << message;
}

}  // namespace
}  // namespace moekit
