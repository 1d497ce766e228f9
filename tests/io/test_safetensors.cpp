#include "moekit/safetensors.hpp"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "io/io_test_support.hpp"
#include "moekit/error.hpp"
#include "moekit/tensor.hpp"

namespace moekit {
namespace {

using io_test::error_message;
using io_test::raw_file;
using io_test::ScratchDir;
using io_test::zeros;

using NamedViews = std::vector<std::pair<std::string, TensorView>>;

Tensor random_bytes_tensor(DType dtype, Shape shape, std::mt19937_64& rng) {
  Tensor tensor = Tensor::empty(dtype, shape);
  auto* bytes = static_cast<uint8_t*>(tensor.view().data);
  for (int64_t i = 0; i < tensor.view().nbytes(); ++i) bytes[i] = static_cast<uint8_t>(rng());
  return tensor;
}

bool same_bytes(std::span<const uint8_t> got, const TensorView& want) {
  return static_cast<int64_t>(got.size()) == want.nbytes() &&
         (got.empty() || std::memcmp(got.data(), want.data, got.size()) == 0);
}

// ---------------------------------------------------------------------------------------------
// Round trips

struct RoundTripTensor {
  std::string name;
  DType dtype;
  Shape shape;
};

// Every dtype safetensors can name, with odd shapes, an empty tensor and a scalar; listed with
// small elements first so that the writer has to reorder them to keep them aligned.
const std::vector<RoundTripTensor> kRoundTripTensors = {
    {"layers.0.i8", DType::i8, {3, 5, 7}},  {"layers.0.f8", DType::f8e4m3, {1, 13}},
    {"layers.0.bf16", DType::bf16, {7, 3}}, {"layers.0.f16", DType::f16, {2, 1, 3, 1}},
    {"layers.0.f32", DType::f32, {5}},      {"layers.0.i32", DType::i32, {3, 3}},
    {"empty", DType::bf16, {0, 4}},         {"scalar", DType::f32, {}},
};

const std::map<std::string, std::string> kMetadata = {{"format", "pt"}, {"note", "é, \"quoted\""}};

std::vector<Tensor> make_round_trip_tensors(NamedViews& views) {
  std::mt19937_64 rng(7);
  std::vector<Tensor> tensors;
  for (const RoundTripTensor& spec : kRoundTripTensors) {
    tensors.push_back(random_bytes_tensor(spec.dtype, spec.shape, rng));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    views.emplace_back(kRoundTripTensors[i].name, tensors[i].view());
  }
  return tensors;
}

void expect_holds_round_trip_tensors(const SafetensorsFile& file, const NamedViews& views) {
  ASSERT_EQ(file.entries().size(), views.size());
  for (const auto& [name, want] : views) {
    SCOPED_TRACE(name);
    const SafetensorsEntry* entry = file.find(name);
    ASSERT_NE(entry, nullptr);
    EXPECT_EQ(entry->dtype_name, safetensors_dtype_name(want.dtype));
    EXPECT_EQ(entry->shape, want.shape);
    EXPECT_TRUE(same_bytes(file.bytes(name), want));
    const TensorView got = file.view(name);
    EXPECT_EQ(got.dtype, want.dtype);
    EXPECT_EQ(got.shape, want.shape);
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got.data) % (dtype_bits(got.dtype) / 8), 0u);
  }
  EXPECT_EQ(file.metadata(), kMetadata);
}

TEST(Safetensors, WrittenFileReadsBackEveryDTypeWithIdenticalBytesAndMetadata) {
  ScratchDir dir;
  NamedViews views;
  const std::vector<Tensor> tensors = make_round_trip_tensors(views);
  write_safetensors(dir.file("model.safetensors"), views, kMetadata);
  expect_holds_round_trip_tensors(SafetensorsFile::open(dir.file("model.safetensors")), views);
}

TEST(Safetensors, EncodedBytesAreTheWrittenFile) {
  ScratchDir dir;
  NamedViews views;
  const std::vector<Tensor> tensors = make_round_trip_tensors(views);
  write_safetensors(dir.file("model.safetensors"), views, kMetadata);
  const std::vector<uint8_t> encoded = encode_safetensors(views, kMetadata);
  EXPECT_EQ(io_test::read_file(dir.file("model.safetensors")), encoded);
  expect_holds_round_trip_tensors(SafetensorsFile::from_bytes(encoded, "memory"), views);
}

TEST(Safetensors, WriterPadsHeaderSoDataStartsEightByteAligned) {
  for (const std::string name : {"a", "ab", "abc", "abcdefgh"}) {
    const float value = 1.0f;
    const std::vector<uint8_t> bytes = encode_safetensors(
        {{name, TensorView::contiguous(const_cast<float*>(&value), DType::f32, {1})}});
    const SafetensorsFile file = SafetensorsFile::from_bytes(bytes, name);
    EXPECT_EQ(file.entries().at(0).begin % 8, 0) << name;
  }
}

TEST(Safetensors, FileWithoutTensorsHasNoEntries) {
  const SafetensorsFile file = SafetensorsFile::from_bytes(encode_safetensors({}), "empty");
  EXPECT_TRUE(file.entries().empty());
  EXPECT_TRUE(file.metadata().empty());
}

TEST(Safetensors, EntriesAreSortedByOffsetWithAbsolutePositions) {
  const std::string header = R"({"z":{"dtype":"I8","shape":[2],"data_offsets":[0,2]},)"
                             R"("a":{"dtype":"I8","shape":[3],"data_offsets":[2,5]}})";
  const SafetensorsFile file = SafetensorsFile::from_bytes(raw_file(header, zeros(5)), "order");
  ASSERT_EQ(file.entries().size(), 2u);
  EXPECT_EQ(file.entries()[0].name, "z");
  EXPECT_EQ(file.entries()[0].begin, static_cast<int64_t>(8 + header.size()));
  EXPECT_EQ(file.entries()[1].name, "a");
  EXPECT_EQ(file.entries()[1].end, static_cast<int64_t>(8 + header.size() + 5));
}

// ---------------------------------------------------------------------------------------------
// Dtypes

struct DTypeRow {
  const char* name;
  int bits;
  const char* shape;
  size_t bytes;
  bool viewable;
};

const DTypeRow kDTypeRows[] = {
    {"F64", 64, "[2]", 16, false},   {"F32", 32, "[2]", 8, true},
    {"F16", 16, "[3]", 6, true},     {"BF16", 16, "[3]", 6, true},
    {"F8_E4M3", 8, "[3]", 3, true},  {"F8_E5M2", 8, "[3]", 3, false},
    {"F8_E8M0", 8, "[3]", 3, false}, {"I64", 64, "[1]", 8, false},
    {"I32", 32, "[2]", 8, true},     {"I16", 16, "[2]", 4, false},
    {"I8", 8, "[3]", 3, true},       {"U8", 8, "[3]", 3, false},
    {"U16", 16, "[1]", 2, false},    {"U32", 32, "[1]", 4, false},
    {"U64", 64, "[1]", 8, false},    {"BOOL", 8, "[5]", 5, false},
    {"C64", 64, "[1]", 8, false},    {"F4", 4, "[4]", 2, false},
    {"F6_E2M3", 6, "[4]", 3, false}, {"F6_E3M2", 6, "[2,4]", 6, false},
};

std::vector<uint8_t> single_tensor_file(const DTypeRow& row) {
  // Padded to 8 bytes so that every viewable tensor is aligned.
  std::string header = fmt::format(R"({{"t":{{"dtype":"{}","shape":{},"data_offsets":[0,{}]}}}})",
                                   row.name, row.shape, row.bytes);
  header.append((8 - header.size() % 8) % 8, ' ');
  return raw_file(header, zeros(row.bytes));
}

TEST(Safetensors, EveryFormatDTypeOpensWithItsSize) {
  for (const DTypeRow& row : kDTypeRows) {
    SCOPED_TRACE(row.name);
    const SafetensorsFile file = SafetensorsFile::from_bytes(single_tensor_file(row), "dtypes");
    const SafetensorsEntry& entry = file.entries().at(0);
    EXPECT_EQ(entry.dtype_name, row.name);
    EXPECT_EQ(entry.element_bits, row.bits);
    EXPECT_EQ(file.bytes("t").size(), row.bytes);
  }
}

TEST(Safetensors, ViewsExistExactlyForDTypesMoekitHas) {
  for (const DTypeRow& row : kDTypeRows) {
    SCOPED_TRACE(row.name);
    const SafetensorsFile file = SafetensorsFile::from_bytes(single_tensor_file(row), "dt.bin");
    if (row.viewable) {
      EXPECT_EQ(safetensors_dtype_name(file.view("t").dtype), row.name);
    } else {
      const std::string message =
          error_message([&] { (void)file.view("t"); }, Errc::invalid_argument);
      EXPECT_NE(message.find("tensor 't'"), std::string::npos) << message;
      EXPECT_NE(message.find("dt.bin"), std::string::npos) << message;
      EXPECT_NE(message.find(fmt::format("dtype {},", row.name)), std::string::npos) << message;
    }
  }
}

TEST(Safetensors, MisalignedTensorHasBytesButNoView) {
  std::string header = R"({"small":{"dtype":"I8","shape":[1],"data_offsets":[0,1]},)"
                       R"("f":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const SafetensorsFile file = SafetensorsFile::from_bytes(raw_file(header, zeros(5)), "odd");
  EXPECT_EQ(file.bytes("f").size(), 4u);
  const std::string message = error_message([&] { (void)file.view("f"); }, Errc::invalid_argument);
  EXPECT_NE(message.find("not aligned"), std::string::npos) << message;
}

TEST(Safetensors, MissingNameIsNamedInTheError) {
  const SafetensorsFile file = SafetensorsFile::from_bytes(encode_safetensors({}), "none.bin");
  EXPECT_EQ(file.find("w"), nullptr);
  for (const auto& read : {std::function<void()>([&] { (void)file.view("w"); }),
                           std::function<void()>([&] { (void)file.bytes("w"); })}) {
    const std::string message = error_message(read, Errc::invalid_argument);
    EXPECT_NE(message.find("no tensor named 'w'"), std::string::npos) << message;
    EXPECT_NE(message.find("none.bin"), std::string::npos) << message;
  }
}

// ---------------------------------------------------------------------------------------------
// Malformed files

// A valid file to break: "a" F32 [2] then "b" I8 [4], 12 data bytes.
const std::string kValidHeader = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                 R"("b":{"dtype":"I8","shape":[4],"data_offsets":[8,12]}})";

std::vector<uint8_t> valid_file() {
  return raw_file(kValidHeader, zeros(12));
}

std::vector<uint8_t> with_header(const std::string& header) {
  return raw_file(header, zeros(12));
}

std::vector<uint8_t> with_replaced(const std::string& from, const std::string& to) {
  std::string header = kValidHeader;
  const size_t at = header.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  header.replace(at, from.size(), to);
  return with_header(header);
}

std::vector<uint8_t> with_length(uint64_t length) {
  std::vector<uint8_t> bytes = valid_file();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(length >> (8 * i));
  return bytes;
}

std::vector<uint8_t> truncated(size_t size) {
  std::vector<uint8_t> bytes = valid_file();
  bytes.resize(size);
  return bytes;
}

std::vector<uint8_t> with_trailing(std::string_view after_json) {
  return with_header(kValidHeader + std::string(after_json));
}

struct MalformedRow {
  const char* what;
  std::vector<uint8_t> bytes;
  const char* expected;
};

std::vector<MalformedRow> malformed_rows() {
  const std::string big = std::to_string(uint64_t{1} << 62);
  return {
      {"empty file", {}, "fewer than the 8"},
      {"7 bytes", truncated(7), "fewer than the 8"},
      {"header length 0", with_length(0), "header length is 0"},
      {"header length past the end", with_length(kValidHeader.size() + 13), "runs past the end"},
      {"header length over the limit", with_length(uint64_t{1} << 40), "over the limit"},
      {"header length 2^64-1", with_length(std::numeric_limits<uint64_t>::max()), "over the limit"},
      {"data truncated", truncated(valid_file().size() - 1), "run past the data section"},
      {"invalid JSON", with_header(R"({"a":{"dtype":)"), "not valid JSON"},
      {"invalid UTF-8", with_replaced(R"("b")", "\"\xff\""), "not valid UTF-8"},
      {"overlong UTF-8", with_replaced(R"("b")", "\"\xc0\xaf\""), "not valid UTF-8"},
      {"UTF-8 surrogate", with_replaced(R"("b")", "\"\xed\xa0\x80\""), "not valid UTF-8"},
      {"header is a list", with_header(R"([1, 2])"), "does not start with '{'"},
      {"leading space", with_header(" " + kValidHeader), "does not start with '{'"},
      {"garbage after the JSON", with_trailing(" x"), "not valid JSON"},
      {"NUL after the JSON", with_trailing(std::string(1, '\0')), "not valid JSON"},
      {"second JSON object", with_trailing("{}"), "not valid JSON"},
      {"comment", with_trailing("/* c */"), "not valid JSON"},
      {"entry not an object",
       with_replaced(R"({"dtype":"I8","shape":[4],"data_offsets":[8,12]})", "[8, 12]"),
       "tensor 'b': entry [8,12] is not an object"},
      {"missing dtype", with_replaced(R"("dtype":"I8",)", ""), "tensor 'b': entry has no 'dtype'"},
      {"missing shape", with_replaced(R"("shape":[4],)", ""), "tensor 'b': entry has no 'shape'"},
      {"missing data_offsets", with_replaced(R"(,"data_offsets":[8,12])", ""),
       "tensor 'b': entry has no 'data_offsets'"},
      {"extra key", with_replaced(R"("dtype":"I8")", R"("dtype":"I8","extra":1)"),
       "unexpected key 'extra'"},
      {"unknown dtype", with_replaced(R"("I8")", R"("I7")"), "unknown dtype \"I7\""},
      {"lower-case dtype", with_replaced(R"("I8")", R"("i8")"), "unknown dtype \"i8\""},
      {"dtype not a string", with_replaced(R"("I8")", "8"), "dtype 8 is not a string"},
      {"shape not a list", with_replaced("[4]", "4"), "shape 4 is not a list"},
      {"negative dimension", with_replaced("[4]", "[-4]"), "not a list of non-negative integers"},
      {"fractional dimension", with_replaced("[4]", "[4.0]"),
       "not a list of non-negative integers"},
      {"string dimension", with_replaced("[4]", R"(["4"])"), "not a list of non-negative"},
      {"nested shape", with_replaced("[4]", "[[4]]"), "not a list of non-negative integers"},
      {"rank 5", with_replaced("[4]", "[1,1,4,1,1]"), "has rank 5, and moekit handles at most 4"},
      {"element count overflow", with_replaced("[4]", "[" + big + "," + big + "]"),
       "more elements than a file can hold"},
      {"dimension past int64", with_replaced("[4]", "[18446744073709551615]"),
       "not a list of non-negative integers"},
      {"one offset", with_replaced("[8,12]", "[8]"), "not two non-negative integers"},
      {"three offsets", with_replaced("[8,12]", "[8,12,12]"), "not two non-negative integers"},
      {"negative offset", with_replaced("[8,12]", "[-8,12]"), "not two non-negative integers"},
      {"offsets not a list", with_replaced("[8,12]", R"("8-12")"), "not two non-negative"},
      {"begin after end", with_replaced("[8,12]", "[12,8]"), "begin after they end"},
      {"end past the data", with_replaced("[8,12]", "[8,13]"), "run past the data section of 12"},
      {"huge offsets", with_replaced("[8,12]", "[8,18446744073709551615]"),
       "not two non-negative integers"},
      {"size does not match shape", with_replaced(R"("shape":[4])", R"("shape":[5])"),
       "hold 4 bytes, but I8[5] needs 5"},
      {"overlap", with_replaced("[8,12]", "[4,8]"), "tensor 'b' (data bytes [4, 8)) overlaps"},
      {"empty tensor inside another",
       with_replaced(R"("shape":[4],"data_offsets":[8,12])", R"("shape":[0],"data_offsets":[4,4])"),
       "overlaps tensor 'a'"},
      {"hole",
       with_replaced(R"("shape":[4],"data_offsets":[8,12])",
                     R"("shape":[3],"data_offsets":[9,12])"),
       "data bytes [8, 9) belong to no tensor"},
      {"bytes after the last tensor",
       with_replaced(R"("shape":[4],"data_offsets":[8,12])",
                     R"("shape":[3],"data_offsets":[8,11])"),
       "data bytes [11, 12) belong to no tensor"},
      {"duplicate tensor name", with_replaced(R"("b")", R"("a")"), "key 'a' appears twice"},
      {"duplicate key in an entry",
       with_replaced(R"("dtype":"I8")", R"("dtype":"I8","dtype":"I8")"),
       "key 'dtype' appears twice"},
      {"metadata value not a string",
       with_header(kValidHeader.substr(0, kValidHeader.size() - 1) +
                   R"(,"__metadata__":{"format":"pt","step":3}})"),
       "__metadata__ value of 'step' is 3, not a string"},
      {"metadata not an object",
       with_header(kValidHeader.substr(0, kValidHeader.size() - 1) + R"(,"__metadata__":"pt"})"),
       "__metadata__ \"pt\" is not an object"},
      {"metadata null",
       with_header(kValidHeader.substr(0, kValidHeader.size() - 1) + R"(,"__metadata__":null})"),
       "__metadata__ null is not an object"},
      {"deep nesting", with_replaced("[4]", std::string(100, '[') + std::string(100, ']')),
       "nests deeper"},
  };
}

TEST(Safetensors, MalformedFilesAreRefusedNamingTheFault) {
  for (const MalformedRow& row : malformed_rows()) {
    SCOPED_TRACE(row.what);
    const std::string message =
        error_message([&] { (void)SafetensorsFile::from_bytes(row.bytes, "bad.safetensors"); },
                      Errc::invalid_argument);
    EXPECT_NE(message.find(row.expected), std::string::npos) << message;
    EXPECT_NE(message.find("bad.safetensors"), std::string::npos) << message;
  }
}

TEST(Safetensors, TheValidFileTheMalformedRowsEditIsAccepted) {
  const SafetensorsFile file = SafetensorsFile::from_bytes(valid_file(), "valid");
  EXPECT_EQ(file.entries().size(), 2u);
}

TEST(Safetensors, WhitespaceAfterTheHeaderJsonIsPadding) {
  for (const std::string padding : {"", " ", "       ", "\n", " \t\r\n"}) {
    const SafetensorsFile file = SafetensorsFile::from_bytes(with_trailing(padding), "padded");
    EXPECT_EQ(file.entries().size(), 2u) << "padding of " << padding.size();
  }
}

TEST(Safetensors, MetadataOfStringsIsRead) {
  const SafetensorsFile file =
      SafetensorsFile::from_bytes(with_header(kValidHeader.substr(0, kValidHeader.size() - 1) +
                                              R"(,"__metadata__":{"format":"pt","total":"12"}})"),
                                  "meta");
  const std::map<std::string, std::string> want = {{"format", "pt"}, {"total", "12"}};
  EXPECT_EQ(file.metadata(), want);
}

TEST(Safetensors, SubByteTensorsMustFillWholeBytes) {
  const struct {
    const char* shape;
    int bytes;
    bool accepted;
  } rows[] = {
      {"[2]", 1, true},  {"[3, 2]", 3, true},  {"[0]", 0, true},
      {"[1]", 1, false}, {"[3, 3]", 5, false},
  };
  for (const auto& row : rows) {
    SCOPED_TRACE(row.shape);
    const std::string header = fmt::format(
        R"({{"t":{{"dtype":"F4","shape":{},"data_offsets":[0,{}]}}}})", row.shape, row.bytes);
    const std::vector<uint8_t> bytes = raw_file(header, zeros(static_cast<size_t>(row.bytes)));
    if (row.accepted) {
      EXPECT_EQ(SafetensorsFile::from_bytes(bytes, "f4").bytes("t").size(),
                static_cast<size_t>(row.bytes));
    } else {
      const std::string message = error_message(
          [&] { (void)SafetensorsFile::from_bytes(bytes, "f4"); }, Errc::invalid_argument);
      EXPECT_NE(message.find("not a whole number of bytes"), std::string::npos) << message;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Files on disk

TEST(Safetensors, MalformedFileOnDiskNamesItsPath) {
  ScratchDir dir;
  const std::vector<uint8_t> bytes = with_replaced(R"("I8")", R"("I7")");
  io_test::write_file(dir.file("bad.safetensors"),
                      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  const std::string message = error_message(
      [&] { (void)SafetensorsFile::open(dir.file("bad.safetensors")); }, Errc::invalid_argument);
  EXPECT_NE(message.find(dir.file("bad.safetensors")), std::string::npos) << message;
  EXPECT_NE(message.find("unknown dtype"), std::string::npos) << message;
}

TEST(Safetensors, EmptyFileOnDiskIsMalformedNotUnreadable) {
  ScratchDir dir;
  io_test::write_file(dir.file("empty.safetensors"), "");
  const std::string message = error_message(
      [&] { (void)SafetensorsFile::open(dir.file("empty.safetensors")); }, Errc::invalid_argument);
  EXPECT_NE(message.find("fewer than the 8"), std::string::npos) << message;
}

TEST(Safetensors, UnreadablePathsAreIoErrorsWithTheReason) {
  ScratchDir dir;
  const std::string missing = dir.file("missing.safetensors");
  std::string message = error_message([&] { (void)SafetensorsFile::open(missing); }, Errc::io);
  EXPECT_NE(message.find(missing), std::string::npos) << message;
  EXPECT_NE(message.find("No such file"), std::string::npos) << message;

  message = error_message([&] { (void)SafetensorsFile::open(dir.path().string()); }, Errc::io);
  EXPECT_NE(message.find("not a regular file"), std::string::npos) << message;
}

TEST(Safetensors, MovedFileKeepsItsViewsValid) {
  float values[2] = {1.5f, -2.0f};
  SafetensorsFile file = SafetensorsFile::from_bytes(
      encode_safetensors({{"w", TensorView::contiguous(values, DType::f32, {2})}}), "moved");
  const TensorView before = file.view("w");
  const SafetensorsFile moved = std::move(file);
  EXPECT_EQ(moved.view("w").data, before.data);
  EXPECT_EQ(moved.view("w").as<float>()[1], -2.0f);
}

// ---------------------------------------------------------------------------------------------
// Writer refusals

TEST(Safetensors, WriterRefusesTensorsSafetensorsCannotHold) {
  uint8_t bytes[16] = {};
  const TensorView i8 = TensorView::contiguous(bytes, DType::i8, {4});
  TensorView strided = TensorView::contiguous(bytes, DType::i8, {2, 2});
  strided.strides = {4, 1};
  const struct {
    const char* what;
    NamedViews tensors;
    const char* expected;
  } rows[] = {
      {"i4", {{"q", TensorView::contiguous(bytes, DType::i4, {8})}}, "i4, which safetensors"},
      {"duplicate names", {{"q", i8}, {"q", i8}}, "has the name of another tensor"},
      {"reserved name", {{"__metadata__", i8}}, "reserved for metadata"},
      {"not contiguous", {{"q", strided}}, "not contiguous"},
      {"on a GPU",
       {{"q", TensorView::contiguous(bytes, DType::i8, {4}, Device::cuda(0))}},
       "not on the CPU"},
      {"negative dimension",
       {{"q", TensorView::contiguous(bytes, DType::i8, {-1})}},
       "negative dimension"},
      {"no data", {{"q", TensorView::contiguous(nullptr, DType::i8, {4})}}, "has no data"},
      {"invalid UTF-8 name", {{"\xff", i8}}, "tensor name is not valid UTF-8"},
  };
  for (const auto& row : rows) {
    SCOPED_TRACE(row.what);
    const std::string message =
        error_message([&] { (void)encode_safetensors(row.tensors); }, Errc::invalid_argument);
    EXPECT_NE(message.find(row.expected), std::string::npos) << message;
  }
}

TEST(Safetensors, WriterRefusesMetadataThatIsNotUtf8) {
  const std::string message = error_message(
      [&] {
        (void)encode_safetensors({}, {{"k", "\xc3"}});
      },
      Errc::invalid_argument);
  EXPECT_NE(message.find("metadata value of 'k'"), std::string::npos) << message;
}

TEST(Safetensors, WriteIntoMissingDirectoryIsAnIoErrorLeavingNothing) {
  ScratchDir dir;
  const std::string path = dir.file("absent/model.safetensors");
  const std::string message = error_message([&] { write_safetensors(path, {}); }, Errc::io);
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("No such file"), std::string::npos) << message;
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Safetensors, WriteReplacesAnExistingFile) {
  ScratchDir dir;
  const std::string path = dir.file("model.safetensors");
  io_test::write_file(path, "old contents");
  int8_t value = 5;
  write_safetensors(path, {{"v", TensorView::contiguous(&value, DType::i8, {1})}});
  EXPECT_EQ(SafetensorsFile::open(path).view("v").as<int8_t>()[0], 5);
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));
}

}  // namespace
}  // namespace moekit
