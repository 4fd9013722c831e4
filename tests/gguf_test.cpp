// GGUF reader/writer: round trips, one test per malformation class (each error must name the
// file, the field and the byte offset), truncation and mutation sweeps, the shared model files,
// and the `lamina inspect` command.
#include "gguf/gguf.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace lamina::gguf {
namespace {

using Bytes = std::vector<uint8_t>;

// Unique per test and process: ctest may run test cases in parallel in the same temp dir.
std::string TempPath(const std::string& tag) {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  return testing::TempDir() + "gguf_test_" + std::to_string(getpid()) + "_" + info->name() + "_" +
         tag + ".gguf";
}

// Removes this process's files (TempPath) when its tests end.
class TempFileCleanup : public testing::Environment {
 public:
  void TearDown() override {
    const std::string prefix = "gguf_test_" + std::to_string(getpid()) + "_";
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(testing::TempDir(), ec)) {
      if (e.path().filename().string().starts_with(prefix)) std::filesystem::remove(e.path(), ec);
    }
  }
};
[[maybe_unused]] testing::Environment* const kTempFileCleanup =
    testing::AddGlobalTestEnvironment(new TempFileCleanup);

void WriteBytes(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

Result<std::unique_ptr<File>> OpenBytes(const Bytes& bytes, const std::string& path) {
  WriteBytes(path, bytes);
  return File::Open(path);
}

// Opens `bytes` and expects a failure whose message contains the path and every fragment.
void ExpectOpenFails(const Bytes& bytes, const std::vector<std::string>& fragments,
                     const std::string& tag = "bad") {
  const std::string path = TempPath(tag);
  auto file = OpenBytes(bytes, path);
  ASSERT_FALSE(file.ok()) << "expected " << path << " to be refused";
  const std::string& msg = file.error().message;
  EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  for (const std::string& f : fragments)
    EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
}

size_t FindOnce(const Bytes& img, const std::string& needle) {
  auto it = std::search(img.begin(), img.end(), needle.begin(), needle.end());
  EXPECT_NE(it, img.end()) << needle;
  const size_t at = static_cast<size_t>(it - img.begin());
  auto again = std::search(it + 1, img.end(), needle.begin(), needle.end());
  EXPECT_EQ(again, img.end()) << needle << " is not unique";
  return at;
}

template <typename T>
void Poke(Bytes* img, size_t at, T v) {
  ASSERT_LE(at + sizeof(T), img->size());
  std::memcpy(img->data() + at, &v, sizeof(T));
}

template <typename T>
T Peek(const Bytes& img, size_t at) {
  T v{};
  std::memcpy(&v, img.data() + at, sizeof(T));
  return v;
}

// Byte positions of a kv entry's fields, located by its (unique) key text.
size_t KeyLengthAt(const Bytes& img, const std::string& key) { return FindOnce(img, key) - 8; }
size_t KvTypeAt(const Bytes& img, const std::string& key) {
  return FindOnce(img, key) + key.size();
}
size_t KvValueAt(const Bytes& img, const std::string& key) { return KvTypeAt(img, key) + 4; }

// Byte positions of a tensor-table entry's fields, located by its (unique) name.
size_t NDimsAt(const Bytes& img, const std::string& name) {
  return FindOnce(img, name) + name.size();
}
size_t NeAt(const Bytes& img, const std::string& name, int d) {
  return NDimsAt(img, name) + 4 + 8 * d;
}
size_t TensorTypeAt(const Bytes& img, const std::string& name) {
  return NeAt(img, name, static_cast<int>(Peek<uint32_t>(img, NDimsAt(img, name))));
}
size_t TensorOffsetAt(const Bytes& img, const std::string& name) {
  return TensorTypeAt(img, name) + 4;
}

std::string AtByte(size_t at) { return "at byte " + std::to_string(at) + ":"; }

Bytes RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

// A small valid file: kv[0..4] and tensor[0..2] in the order below.
Writer SmallWriter() {
  Writer w;
  w.SetString("general.architecture", "llama");
  w.SetU32("test.count", 7);
  w.SetBool("test.flag", true);
  w.SetStringArray("test.words", {"alpha", "beta", "gamma"});
  w.SetF32Array("test.floats", {1.5f, -2.0f});
  const Bytes a = RandomBytes(4 * 2 * 4, 1);
  const Bytes b = RandomBytes(2 * 34, 2);
  const Bytes c = RandomBytes(8 * 2, 3);
  w.AddTensor("tensor.a", GgmlType::kF32, {4, 2}, a.data(), a.size());
  w.AddTensor("tensor.b", GgmlType::kQ8_0, {32, 2}, b.data(), b.size());
  w.AddTensor("tensor.c", GgmlType::kF16, {8}, c.data(), c.size());
  return w;
}

Bytes SmallFile() { return SmallWriter().Serialize(); }

Value Scalar(ValueType t, uint64_t u, int64_t i, double f) {
  Value v;
  v.type = t;
  v.u = u;
  v.i = i;
  v.f = f;
  return v;
}
Value Str(const std::string& s) {
  Value v;
  v.type = ValueType::kString;
  v.str = s;
  return v;
}
Value Arr(ValueType elem, std::vector<Value> items) {
  Value v;
  v.type = ValueType::kArray;
  v.elem_type = elem;
  v.array = std::move(items);
  return v;
}

void ExpectSameValue(const Value& want, const Value& got, const std::string& where) {
  ASSERT_EQ(want.type, got.type) << where;
  switch (want.type) {
    case ValueType::kU8:
    case ValueType::kU16:
    case ValueType::kU32:
    case ValueType::kU64:
    case ValueType::kBool:
      EXPECT_EQ(want.u, got.u) << where;
      break;
    case ValueType::kI8:
    case ValueType::kI16:
    case ValueType::kI32:
    case ValueType::kI64:
      EXPECT_EQ(want.i, got.i) << where;
      break;
    case ValueType::kF32:
    case ValueType::kF64:
      EXPECT_EQ(want.f, got.f) << where;
      break;
    case ValueType::kString:
      EXPECT_EQ(want.str, got.str) << where;
      break;
    case ValueType::kArray:
      ASSERT_EQ(want.elem_type, got.elem_type) << where;
      ASSERT_EQ(want.array.size(), got.array.size()) << where;
      for (size_t k = 0; k < want.array.size(); ++k) {
        ExpectSameValue(want.array[k], got.array[k], where + "[" + std::to_string(k) + "]");
      }
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// Round trips

TEST(GgufRoundTrip, EveryValueTypeAndTensorType) {
  std::vector<std::pair<std::string, Value>> values = {
      {"v.u8", Scalar(ValueType::kU8, 200, 0, 0)},
      {"v.i8", Scalar(ValueType::kI8, 0, -100, 0)},
      {"v.u16", Scalar(ValueType::kU16, 60000, 0, 0)},
      {"v.i16", Scalar(ValueType::kI16, 0, -30000, 0)},
      {"v.u32", Scalar(ValueType::kU32, 4000000000u, 0, 0)},
      {"v.i32", Scalar(ValueType::kI32, 0, -2000000000, 0)},
      {"v.f32", Scalar(ValueType::kF32, 0, 0, 0.15625)},
      {"v.bool0", Scalar(ValueType::kBool, 0, 0, 0)},
      {"v.bool1", Scalar(ValueType::kBool, 1, 0, 0)},
      {"v.string", Str("hello \xe2\x9c\x93 world")},
      {"v.empty_string", Str("")},
      {"v.u64", Scalar(ValueType::kU64, 0xfedcba9876543210ull, 0, 0)},
      {"v.i64", Scalar(ValueType::kI64, 0, INT64_MIN + 5, 0)},
      {"v.f64", Scalar(ValueType::kF64, 0, 0, 3.141592653589793)},
      {"a.u8",
       Arr(ValueType::kU8, {Scalar(ValueType::kU8, 1, 0, 0), Scalar(ValueType::kU8, 255, 0, 0)})},
      {"a.i16", Arr(ValueType::kI16, {Scalar(ValueType::kI16, 0, -7, 0)})},
      {"a.u64", Arr(ValueType::kU64, {Scalar(ValueType::kU64, ~0ull, 0, 0)})},
      {"a.f64", Arr(ValueType::kF64,
                    {Scalar(ValueType::kF64, 0, 0, -0.5), Scalar(ValueType::kF64, 0, 0, 1e300)})},
      {"a.bool", Arr(ValueType::kBool,
                     {Scalar(ValueType::kBool, 1, 0, 0), Scalar(ValueType::kBool, 0, 0, 0)})},
      {"a.empty", Arr(ValueType::kI32, {})},
      {"a.strings", Arr(ValueType::kString, {Str("a"), Str(""), Str("ccc")})},
      {"a.nested",
       Arr(ValueType::kArray,
           {Arr(ValueType::kI32,
                {Scalar(ValueType::kI32, 0, 1, 0), Scalar(ValueType::kI32, 0, 2, 0)}),
            Arr(ValueType::kString, {Str("x"), Str("yz")}),
            Arr(ValueType::kArray, {Arr(ValueType::kU8, {Scalar(ValueType::kU8, 9, 0, 0)})})})},
  };
  Writer w;
  for (const auto& [k, v] : values) w.SetValue(k, v);
  w.SetU32("h.u32", 11);
  w.SetI32("h.i32", -12);
  w.SetU64("h.u64", 1ull << 40);
  w.SetF32("h.f32", 0.25f);
  w.SetBool("h.bool", true);
  w.SetString("h.string", "str");
  w.SetStringArray("h.strings", {"one", "two"});
  w.SetF32Array("h.floats", {0.5f, -1.0f});
  w.SetI32Array("h.ints", {-1, 0, 1});
  w.SetU32("h.u32", 13);  // replaces, keeps position

  struct T {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
  };
  const std::vector<T> tensors = {
      {"t.f32", GgmlType::kF32, {3, 5}},          {"t.f16", GgmlType::kF16, {7}},
      {"t.bf16", GgmlType::kBF16, {2, 3, 4}},     {"t.q4_0", GgmlType::kQ4_0, {64, 3}},
      {"t.q8_0", GgmlType::kQ8_0, {32, 1, 2, 2}}, {"t.q4_k", GgmlType::kQ4_K, {256, 2}},
      {"t.q6_k", GgmlType::kQ6_K, {512}},
  };
  std::vector<Bytes> datas;
  for (size_t k = 0; k < tensors.size(); ++k) {
    int64_t rows = 1;
    for (size_t d = 1; d < tensors[k].ne.size(); ++d) rows *= tensors[k].ne[d];
    datas.push_back(RandomBytes(RowSize(tensors[k].type, tensors[k].ne[0]) * rows, 100 + k));
    w.AddTensor(tensors[k].name, tensors[k].type, tensors[k].ne, datas[k].data(), datas[k].size());
  }

  const std::string path = TempPath("rt");
  ASSERT_TRUE(w.WriteFile(path).ok());
  auto opened = File::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  const File& f = **opened;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.file_size(), std::filesystem::file_size(path));
  EXPECT_EQ(f.path(), path);

  ASSERT_EQ(f.metadata().size(), values.size() + 9);
  for (size_t k = 0; k < values.size(); ++k) {
    EXPECT_EQ(f.metadata()[k].first, values[k].first);
    ExpectSameValue(values[k].second, f.metadata()[k].second, values[k].first);
  }
  EXPECT_EQ(f.metadata()[values.size()].first, "h.u32");
  EXPECT_EQ(*f.GetInt("h.u32"), 13);
  EXPECT_EQ(*f.GetInt("h.i32"), -12);
  EXPECT_EQ(*f.GetInt("h.u64"), int64_t{1} << 40);
  EXPECT_EQ(*f.GetFloat("h.f32"), 0.25);
  EXPECT_TRUE(*f.GetBool("h.bool"));
  EXPECT_EQ(*f.GetString("h.string"), "str");
  const Value* strings = f.Find("h.strings");
  ASSERT_NE(strings, nullptr);
  ASSERT_EQ(strings->array.size(), 2u);
  EXPECT_EQ(strings->array[1].str, "two");
  EXPECT_EQ(f.Find("h.floats")->array[1].f, -1.0);
  EXPECT_EQ(f.Find("h.ints")->array[0].i, -1);

  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    const TensorInfo* t = f.FindTensor(tensors[k].name);
    ASSERT_NE(t, nullptr) << tensors[k].name;
    EXPECT_EQ(t, &f.tensors()[k]);
    EXPECT_EQ(t->type, tensors[k].type);
    EXPECT_EQ(t->n_dims, tensors[k].ne.size());
    uint64_t n = 1;
    for (uint32_t d = 0; d < kMaxDims; ++d) {
      const int64_t want = d < tensors[k].ne.size() ? tensors[k].ne[d] : 1;
      EXPECT_EQ(t->ne[d], want) << tensors[k].name << " ne[" << d << "]";
      n *= static_cast<uint64_t>(want);
    }
    EXPECT_EQ(t->n_elements, n);
    EXPECT_EQ(t->n_bytes, datas[k].size());
    EXPECT_EQ(t->offset % 32, 0u);
    ASSERT_NE(t->data, nullptr);
    EXPECT_EQ(std::memcmp(t->data, datas[k].data(), datas[k].size()), 0) << tensors[k].name;
  }
  EXPECT_EQ(f.FindTensor("missing"), nullptr);
  EXPECT_EQ(f.Find("missing"), nullptr);
}

TEST(GgufRoundTrip, Version2AndNoTensors) {
  Writer w(2);
  w.SetString("general.architecture", "x");
  auto f = OpenBytes(w.Serialize(), TempPath("v2"));
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ((*f)->version(), 2u);
  EXPECT_TRUE((*f)->tensors().empty());

  Writer empty;
  auto e = OpenBytes(empty.Serialize(), TempPath("empty"));
  ASSERT_TRUE(e.ok()) << e.error().message;
  EXPECT_TRUE((*e)->metadata().empty());
}

TEST(GgufRoundTrip, CustomAlignmentIsHonored) {
  Writer w = SmallWriter();
  w.SetU32("general.alignment", 256);
  const Bytes img = w.Serialize();
  auto f = OpenBytes(img, TempPath("a256"));
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ((*f)->alignment(), 256u);
  EXPECT_EQ((*f)->data_offset() % 256, 0u);
  for (const TensorInfo& t : (*f)->tensors()) {
    EXPECT_EQ(t.offset % 256, 0u) << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 256, 0u)
        << t.name;  // mappings are page aligned
  }
  EXPECT_EQ((*f)->tensors()[1].offset, 256u);
}

TEST(GgufRoundTrip, NestingUpToTheCap) {
  auto nest = [](int levels) {
    Value v = Arr(ValueType::kU8, {Scalar(ValueType::kU8, 5, 0, 0)});
    for (int k = 1; k < levels; ++k) v = Arr(ValueType::kArray, {v});
    return v;
  };
  Writer ok;
  ok.SetValue("deep", nest(kMaxArrayNesting));
  auto f = OpenBytes(ok.Serialize(), TempPath("ok"));
  ASSERT_TRUE(f.ok()) << f.error().message;

  Writer bad;
  bad.SetValue("deep", nest(kMaxArrayNesting + 1));
  ExpectOpenFails(bad.Serialize(),
                  {"kv[0] \"deep\" value[0][0][0][0][0][0][0][0]", "nested deeper"});
}

TEST(GgufGetters, TypesConversionsAndDefaults) {
  Writer w;
  w.SetU32("u32", 7);
  w.SetU64("big", ~0ull);
  w.SetI32("neg", -3);
  w.SetF32("f", 1.5f);
  w.SetBool("b", true);
  w.SetString("s", "text");
  auto opened = OpenBytes(w.Serialize(), TempPath("g"));
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  const File& f = **opened;

  EXPECT_EQ(*f.GetInt("u32"), 7);
  EXPECT_EQ(*f.GetInt("neg"), -3);
  EXPECT_EQ(*f.GetFloat("u32"), 7.0);
  EXPECT_EQ(*f.GetFloat("f"), 1.5);
  EXPECT_TRUE(*f.GetBool("b"));
  EXPECT_EQ(*f.GetString("s"), "text");

  auto big = f.GetInt("big");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("\"big\""), std::string::npos) << big.error().message;
  auto missing = f.GetString("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("missing"), std::string::npos);
  EXPECT_NE(missing.error().message.find(f.path()), std::string::npos);
  auto wrong = f.GetString("u32");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find("u32"), std::string::npos) << wrong.error().message;
  EXPECT_FALSE(f.GetInt("s").ok());
  EXPECT_FALSE(f.GetFloat("s").ok());
  EXPECT_FALSE(f.GetBool("u32").ok());

  EXPECT_EQ(*f.GetIntOr("nope", 42), 42);
  EXPECT_EQ(*f.GetIntOr("u32", 42), 7);
  EXPECT_FALSE(f.GetIntOr("s", 42).ok());
  EXPECT_EQ(*f.GetFloatOr("nope", 2.5), 2.5);
  EXPECT_FALSE(f.GetFloatOr("s", 2.5).ok());
  EXPECT_FALSE(*f.GetBoolOr("nope", false));
  EXPECT_TRUE(*f.GetBoolOr("b", false));
  EXPECT_FALSE(f.GetBoolOr("s", false).ok());

  int64_t i = 0;
  double d = 0;
  EXPECT_TRUE(f.Find("b")->AsInt64(&i));
  EXPECT_EQ(i, 1);
  EXPECT_FALSE(f.Find("b")->IsInteger());
  EXPECT_TRUE(f.Find("u32")->IsInteger());
  EXPECT_FALSE(f.Find("s")->AsDouble(&d));
  EXPECT_FALSE(f.Find("f")->AsInt64(&i));
  EXPECT_STREQ(ValueTypeName(ValueType::kArray), "array");
  EXPECT_STREQ(ValueTypeName(ValueType::kF64), "f64");
}

// ---------------------------------------------------------------------------------------------
// One test per malformation class

TEST(GgufMalformed, BadMagic) {
  Bytes img = SmallFile();
  img[0] = 'X';
  ExpectOpenFails(img, {"header.magic", AtByte(0), "bad magic"});
}

TEST(GgufMalformed, EmptyFile) { ExpectOpenFails({}, {"header.magic", AtByte(0), "truncated"}); }

TEST(GgufMalformed, UnsupportedVersion) {
  Bytes img = SmallFile();
  Poke<uint32_t>(&img, 4, 1);
  ExpectOpenFails(img, {"header.version", AtByte(4), "unsupported version 1"}, "v1");
  Poke<uint32_t>(&img, 4, 4);
  ExpectOpenFails(img, {"header.version", AtByte(4), "unsupported version 4"}, "v4");
  Poke<uint32_t>(&img, 4, 0x03000000u);
  ExpectOpenFails(img, {"header.version", AtByte(4), "big-endian"}, "be");
}

TEST(GgufMalformed, Truncated) {
  const Bytes img = SmallFile();
  // Cut inside the last tensor's name: the name's bytes run past the end.
  const size_t name_at = FindOnce(img, "tensor.c");
  Bytes cut(img.begin(), img.begin() + name_at + 3);
  ExpectOpenFails(cut, {"tensor[2].name", AtByte(name_at - 8), "truncated"}, "name");
  // Cut in the metadata: the tensor table cannot fit in what is left.
  Bytes early(img.begin(), img.begin() + KvValueAt(img, "test.floats"));
  ExpectOpenFails(early, {"kv[4] \"test.floats\" value", "truncated"}, "kv");
  // Cut inside the data section: the last tensor's data is incomplete.
  Bytes short_data(img.begin(), img.end() - 1);
  ExpectOpenFails(
      short_data,
      {"tensor[2] \"tensor.c\".offset", AtByte(TensorOffsetAt(img, "tensor.c")), "past the end"},
      "data");
}

TEST(GgufMalformed, StringLengthOverCap) {
  Bytes img = SmallFile();
  const size_t at = KeyLengthAt(img, "test.count");
  Poke<uint64_t>(&img, at, kMaxStringLength + 1);
  ExpectOpenFails(img, {"kv[1].key", AtByte(at), "exceeds the cap"});
  // A value string, too.
  img = SmallFile();
  const size_t v = KvValueAt(img, "general.architecture");
  Poke<uint64_t>(&img, v, ~0ull);
  ExpectOpenFails(img, {"kv[0] \"general.architecture\" value", AtByte(v), "string length"}, "v");
}

TEST(GgufMalformed, ArrayLengthOverCap) {
  Bytes img = SmallFile();
  const size_t len_at = KvValueAt(img, "test.words") + 4;
  Poke<uint64_t>(&img, len_at, kMaxArrayLength + 1);
  ExpectOpenFails(img, {"kv[3] \"test.words\" value.length", AtByte(len_at), "exceeds the cap"});
}

TEST(GgufMalformed, ArrayLengthBeyondFile) {
  // Under the cap but more elements than bytes left: refused before allocating anything.
  Bytes img = SmallFile();
  const size_t len_at = KvValueAt(img, "test.floats") + 4;
  Poke<uint64_t>(&img, len_at, kMaxArrayLength);
  ExpectOpenFails(img, {"kv[4] \"test.floats\" value.length", AtByte(len_at), "bytes left"});
}

TEST(GgufMalformed, StringInArrayTruncated) {
  Bytes img = SmallFile();
  const size_t beta = FindOnce(img, "beta") - 8;
  Poke<uint64_t>(&img, beta, 1000000);
  ExpectOpenFails(img, {"kv[3] \"test.words\" value[1]", AtByte(beta), "truncated"});
}

TEST(GgufMalformed, TooManyTensorsOrKeyValues) {
  Bytes img = SmallFile();
  Poke<uint64_t>(&img, 8, kMaxTensors + 1);
  ExpectOpenFails(img, {"header.n_tensors", AtByte(8), "exceeds the cap"}, "t");
  img = SmallFile();
  Poke<uint64_t>(&img, 8, kMaxTensors);
  ExpectOpenFails(img, {"header.n_tensors", AtByte(8), "bytes left"}, "t2");
  img = SmallFile();
  Poke<uint64_t>(&img, 16, ~0ull);
  ExpectOpenFails(img, {"header.n_kv", AtByte(16), "exceeds the cap"}, "kv");
  img = SmallFile();
  Poke<uint64_t>(&img, 16, kMaxKeyValues);
  ExpectOpenFails(img, {"header.n_kv", AtByte(16), "bytes left"}, "kv2");
}

TEST(GgufMalformed, TooManyDims) {
  Bytes img = SmallFile();
  const size_t at = NDimsAt(img, "tensor.a");
  Poke<uint32_t>(&img, at, 5);
  ExpectOpenFails(img, {"tensor[0] \"tensor.a\".n_dims", AtByte(at), "n_dims 5"});
}

TEST(GgufMalformed, NonPositiveDimension) {
  Bytes img = SmallFile();
  const size_t at = NeAt(img, "tensor.a", 1);
  Poke<uint64_t>(&img, at, 0);
  ExpectOpenFails(img, {"tensor[0] \"tensor.a\".ne[1]", AtByte(at), "must be positive"}, "zero");
  Poke<int64_t>(&img, at, -5);
  ExpectOpenFails(img, {"tensor[0] \"tensor.a\".ne[1]", AtByte(at), "-5"}, "neg");
}

TEST(GgufMalformed, DimensionProductOverflow) {
  Bytes img = SmallFile();
  Poke<uint64_t>(&img, NeAt(img, "tensor.a", 0), 1ull << 40);
  const size_t at = NeAt(img, "tensor.a", 1);
  Poke<uint64_t>(&img, at, 1ull << 30);
  ExpectOpenFails(img, {"tensor[0] \"tensor.a\".ne[1]", AtByte(at), "overflow"});
}

TEST(GgufMalformed, HugeTensorPastEndOfFile) {
  // No int64 overflow, but the byte count runs far past the file.
  Bytes img = SmallFile();
  Poke<uint64_t>(&img, NeAt(img, "tensor.a", 0), 1ull << 40);
  ExpectOpenFails(img, {"tensor[0] \"tensor.a\".offset", AtByte(TensorOffsetAt(img, "tensor.a")),
                        "past the end"});
}

TEST(GgufMalformed, RowNotMultipleOfBlockSize) {
  Bytes img = SmallFile();
  const size_t at = NeAt(img, "tensor.b", 0);
  Poke<uint64_t>(&img, at, 33);
  ExpectOpenFails(img, {"tensor[1] \"tensor.b\".ne[0]", AtByte(at), "Q8_0 block size 32"});
}

TEST(GgufMalformed, UnknownTensorType) {
  Bytes img = SmallFile();
  const size_t at = TensorTypeAt(img, "tensor.c");
  Poke<uint32_t>(&img, at, 99);
  ExpectOpenFails(img, {"tensor[2] \"tensor.c\".type", AtByte(at), "unknown ggml type 99"});
}

TEST(GgufMalformed, DuplicateTensorName) {
  Bytes img = SmallFile();
  const size_t at = FindOnce(img, "tensor.b");
  img[at + 7] = 'a';
  ExpectOpenFails(img, {"tensor[1].name", AtByte(at - 8), "duplicate tensor name \"tensor.a\""});
}

TEST(GgufMalformed, DuplicateMetadataKey) {
  Writer w = SmallWriter();
  w.SetU32("dup.aaa", 1);
  w.SetU32("dup.bbb", 2);
  Bytes img = w.Serialize();
  const size_t at = FindOnce(img, "dup.bbb");
  std::memcpy(img.data() + at, "dup.aaa", 7);
  ExpectOpenFails(img, {"kv[6].key", AtByte(at - 8), "duplicate metadata key \"dup.aaa\""});
}

TEST(GgufMalformed, DataOffsetOutOfRange) {
  Bytes img = SmallFile();
  const size_t at = TensorOffsetAt(img, "tensor.c");
  Poke<uint64_t>(&img, at, Peek<uint64_t>(img, at) + 32 * 100);
  ExpectOpenFails(img, {"tensor[2] \"tensor.c\".offset", AtByte(at), "past the end"}, "far");
  // An offset whose sum with the data start overflows uint64.
  Poke<uint64_t>(&img, at, ~0ull - 31);
  ExpectOpenFails(img, {"tensor[2] \"tensor.c\".offset", AtByte(at), "past the end"}, "wrap");
}

TEST(GgufMalformed, DataOffsetMisaligned) {
  Bytes img = SmallFile();
  const size_t at = TensorOffsetAt(img, "tensor.b");
  Poke<uint64_t>(&img, at, Peek<uint64_t>(img, at) + 4);
  ExpectOpenFails(
      img, {"tensor[1] \"tensor.b\".offset", AtByte(at), "not a multiple of the alignment 32"});
}

TEST(GgufMalformed, AlignmentNotPowerOfTwo) {
  Writer w = SmallWriter();
  w.SetU32("general.alignment", 48);
  Bytes img = w.Serialize();
  const size_t at = KvValueAt(img, "general.alignment");
  ExpectOpenFails(img, {"kv[5] \"general.alignment\" value", AtByte(at), "power of two"}, "48");
  Poke<uint32_t>(&img, at, 0);
  ExpectOpenFails(img, {"kv[5] \"general.alignment\" value", AtByte(at), "power of two"}, "0");

  Writer wrong_type = SmallWriter();
  wrong_type.SetI32("general.alignment", 32);
  ExpectOpenFails(wrong_type.Serialize(), {"\"general.alignment\" value", "must be u32"}, "i32");
}

TEST(GgufMalformed, BadBoolValue) {
  Bytes img = SmallFile();
  const size_t at = KvValueAt(img, "test.flag");
  img[at] = 2;
  ExpectOpenFails(img, {"kv[2] \"test.flag\" value", AtByte(at), "bad bool value 2"}, "scalar");

  Writer w;
  w.SetValue("bools", Arr(ValueType::kBool,
                          {Scalar(ValueType::kBool, 1, 0, 0), Scalar(ValueType::kBool, 0, 0, 0)}));
  Bytes arr = w.Serialize();
  const size_t elem = KvValueAt(arr, "bools") + 4 + 8 + 1;
  arr[elem] = 0x80;
  ExpectOpenFails(arr, {"kv[0] \"bools\" value[1]", AtByte(elem), "bad bool value 128"}, "array");
}

TEST(GgufMalformed, InvalidValueType) {
  Bytes img = SmallFile();
  const size_t at = KvTypeAt(img, "test.count");
  Poke<uint32_t>(&img, at, 13);
  ExpectOpenFails(img, {"kv[1] \"test.count\".type", AtByte(at), "invalid value type 13"}, "kv");

  img = SmallFile();
  const size_t elem_at = KvValueAt(img, "test.words");
  Poke<uint32_t>(&img, elem_at, 0xdeadbeef);
  ExpectOpenFails(
      img, {"kv[3] \"test.words\" value.elem_type", AtByte(elem_at), "invalid value type"}, "elem");
}

// ---------------------------------------------------------------------------------------------
// Sweeps

TEST(GgufSweep, EveryTruncationFails) {
  const Bytes img = SmallFile();
  const std::string path = TempPath("t");
  {
    auto whole = OpenBytes(img, path);
    ASSERT_TRUE(whole.ok()) << whole.error().message;
  }
  for (size_t len = 0; len < img.size(); ++len) {
    auto f = OpenBytes(Bytes(img.begin(), img.begin() + len), path);
    ASSERT_FALSE(f.ok()) << "truncated to " << len << " of " << img.size() << " bytes opened";
    const std::string& msg = f.error().message;
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(" at byte "), std::string::npos) << msg;
  }
}

TEST(GgufSweep, RandomMutationsNeverCrash) {
  const Bytes base = SmallFile();
  // Data bytes cannot make the header invalid; aim most mutations at the header and table.
  size_t header_end = 0;
  {
    auto f = OpenBytes(base, TempPath("base"));
    ASSERT_TRUE(f.ok()) << f.error().message;
    header_end = (*f)->data_offset();
  }
  const std::string path = TempPath("m");
  std::mt19937 rng(20240607);
  constexpr uint8_t kSpecial[] = {0x00, 0x01, 0x02, 0x7f, 0x80, 0xff, 0x20, 0x10};
  int opened = 0;
  int refused = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    Bytes img = base;
    const int n_changes = 1 + static_cast<int>(rng() % 4);
    for (int c = 0; c < n_changes; ++c) {
      const size_t limit = (rng() % 8 == 0) ? img.size() : header_end;
      const size_t at = rng() % limit;
      switch (rng() % 4) {
        case 0:
          img[at] = static_cast<uint8_t>(rng());
          break;
        case 1:
          img[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
          break;
        case 2:
          img[at] = kSpecial[rng() % std::size(kSpecial)];
          break;
        case 3:  // a whole little-endian word of 0xff / 0x00
          for (size_t k = at; k < std::min(img.size(), at + 8); ++k)
            img[k] = (rng() & 1) ? 0xff : 0x00;
          break;
      }
    }
    if (rng() % 16 == 0) img.resize(rng() % img.size());
    auto f = OpenBytes(img, path);
    if (f.ok()) {
      ++opened;
      // Touch the first and last byte of every tensor: they must lie inside the mapping.
      unsigned sum = 0;
      for (const TensorInfo& t : (*f)->tensors()) {
        ASSERT_GT(t.n_bytes, 0u);
        sum += t.data[0] + t.data[t.n_bytes - 1];
      }
      EXPECT_GE(sum, 0u);
    } else {
      ++refused;
      EXPECT_EQ(f.error().message.rfind(path + ": ", 0), 0u) << f.error().message;
      EXPECT_EQ(f.error().message.find('\n'), std::string::npos) << f.error().message;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(opened, 0);
}

// ---------------------------------------------------------------------------------------------
// Shared fixture files

std::string SharedDir() { return LAMINA_SHARED_DIR; }

TEST(GgufShared, EveryFileOpens) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(SharedDir()))
    GTEST_SKIP() << "shared fixtures not found at " << SharedDir();
  int count = 0;
  for (const char* sub : {"/models", "/vocab"}) {
    const fs::path dir = SharedDir() + sub;
    if (!fs::is_directory(dir)) continue;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.path().extension() != ".gguf") continue;
      auto f = File::Open(entry.path().string());
      ASSERT_TRUE(f.ok()) << f.error().message;
      EXPECT_GE((*f)->version(), 2u);
      EXPECT_FALSE((*f)->metadata().empty()) << entry.path();
      for (const TensorInfo& t : (*f)->tensors()) {
        EXPECT_NE(t.data, nullptr) << t.name;
        EXPECT_LE((*f)->data_offset() + t.offset + t.n_bytes, (*f)->file_size()) << t.name;
        EXPECT_EQ(t.offset % (*f)->alignment(), 0u);
      }
      ++count;
    }
  }
  EXPECT_GT(count, 0);
}

TEST(GgufShared, Stories260KFacts) {
  const std::string path = SharedDir() + "/models/stories260K.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared fixture not found: " << path;
  auto opened = File::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  const File& f = **opened;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetInt("llama.embedding_length"), 64);
  const TensorInfo* emb = f.FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, GgmlType::kF32);
  EXPECT_EQ(emb->n_dims, 2u);
  EXPECT_EQ(emb->ne[0], 64);
  EXPECT_EQ(emb->ne[1], 512);
  EXPECT_EQ(emb->n_bytes, 64u * 512u * 4u);
  const Value* tokens = f.Find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->elem_type, ValueType::kString);
  EXPECT_EQ(tokens->array.size(), 512u);
}

// ---------------------------------------------------------------------------------------------
// `lamina inspect`

#ifdef LAMINA_BINARY
struct CommandResult {
  int exit_code = -1;
  std::string output;
};

CommandResult RunCommand(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(GgufInspect, ExitCodesAndJson) {
  const std::string model = SharedDir() + "/models/stories260K.gguf";
  const std::string bin = LAMINA_BINARY;
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "shared fixture not found: " << model;

  CommandResult text = RunCommand("'" + bin + "' inspect '" + model + "' 2>&1");
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("token_embd.weight"), std::string::npos);
  EXPECT_NE(text.output.find("48 tensors"), std::string::npos) << text.output;

  CommandResult json = RunCommand("'" + bin + "' inspect --json '" + model + "' 2>/dev/null");
  ASSERT_EQ(json.exit_code, 0);
  const nlohmann::json j = nlohmann::json::parse(json.output);
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["metadata"]["general.architecture"], "llama");
  EXPECT_EQ(j["metadata"]["tokenizer.ggml.tokens"]["length"], 512);
  ASSERT_EQ(j["tensors"].size(), 48u);
  EXPECT_EQ(j["tensors"][0]["name"], "token_embd.weight");
  EXPECT_EQ(j["tensors"][0]["ne"], nlohmann::json::array({64, 512}));
  EXPECT_EQ(j["tensors"][0]["type"], "F32");
  EXPECT_EQ(j["tensors"][0]["bytes"], 131072);

  Bytes img = SmallFile();
  Poke<uint32_t>(&img, TensorTypeAt(img, "tensor.c"), 99);
  const std::string bad = TempPath("bad");
  WriteBytes(bad, img);
  CommandResult fail = RunCommand("'" + bin + "' inspect '" + bad + "' 2>&1 >/dev/null");
  EXPECT_EQ(fail.exit_code, 3) << fail.output;
  EXPECT_EQ(fail.output.rfind("lamina: " + bad + ": tensor[2]", 0), 0u) << fail.output;
  EXPECT_NE(fail.output.find("unknown ggml type 99"), std::string::npos) << fail.output;
}

// A file of a type or an architecture lamina does not run is still read and shown: `inspect`
// names what is missing, and loading it fails with the type's GGML name (not "unknown type").
TEST(GgufInspect, NamesTypesAndArchitecturesLaminaCannotRun) {
  const std::string model = SharedDir() + "/models/stories260K.gguf";
  const std::string bin = LAMINA_BINARY;
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "shared fixture not found: " << model;
  std::ifstream in(model, std::ios::binary);
  Bytes img((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // An F32 [64, 64] matrix becomes I8 (a GGML type lamina has no kernels for; its 4,096 bytes
  // fit in the F32 tensor's place).
  Poke<uint32_t>(&img, TensorTypeAt(img, "blk.0.attn_q.weight"), 24);
  const std::string typed = TempPath("i8");
  WriteBytes(typed, img);
  CommandResult json = RunCommand("'" + bin + "' inspect --json '" + typed + "' 2>/dev/null");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  nlohmann::json j = nlohmann::json::parse(json.output);
  EXPECT_EQ(j["lamina"]["runs"], false);
  EXPECT_TRUE(j["lamina"]["reason"].get<std::string>().starts_with(
      "tensor blk.0.attn_q.weight has type I8, which lamina cannot compute"))
      << j["lamina"];
  EXPECT_EQ(j["lamina"]["architecture_supported"], true);
  EXPECT_EQ(j["lamina"]["uncomputed_types"], nlohmann::json({{"I8", 1}}));
  CommandResult run = RunCommand("'" + bin + "' run -m '" + typed + "' -p hi -n 1 2>&1");
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_NE(run.output.find("tensor blk.0.attn_q.weight has type I8, which lamina cannot compute"),
            std::string::npos)
      << run.output;

  // An architecture lamina has no row for ("llama" -> "gemma", the same length).
  const size_t arch = KvValueAt(img, "general.architecture");  // u64 length, then the bytes
  ASSERT_EQ(Peek<uint64_t>(img, arch), 5u);
  std::memcpy(img.data() + arch + 8, "gemma", 5);
  const std::string other = TempPath("gemma");
  WriteBytes(other, img);
  CommandResult text = RunCommand("'" + bin + "' inspect '" + other + "' 2>&1");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  // The loader's reason (its first refusal), then the types it could not compute either.
  EXPECT_NE(text.output.find("lamina cannot run this file: unsupported architecture \"gemma\" "
                             "(supported: llama, "),
            std::string::npos)
      << text.output;
  EXPECT_NE(text.output.find("(tensor types lamina cannot compute yet: I8 (1 tensor))"),
            std::string::npos)
      << text.output;
  CommandResult plain = RunCommand("'" + bin + "' inspect '" + model + "' 2>&1");
  EXPECT_NE(plain.output.find("lamina can run this file (architecture llama)"), std::string::npos)
      << plain.output;
}
#endif

}  // namespace
}  // namespace lamina::gguf
