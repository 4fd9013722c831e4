// GGUF reader (memory-mapped) and writer.
//
// Format (little-endian), versions 2 and 3 (version 1 used 32-bit counts and is refused):
//   magic "GGUF" (4 bytes) | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x { string key | u32 value_type | value }
//   n_tensors x { string name | u32 n_dims (<= 4) | u64 ne[n_dims] | u32 ggml_type | u64 offset }
//   padding to `general.alignment` (u32, default 32, a power of two)
//   tensor data: each tensor at data_start + offset, offset a multiple of the alignment
// string = u64 length + bytes (no terminator). value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32,
// 6 f32, 7 bool (1 byte), 8 string, 9 array (u32 elem_type, u64 count, elems; arrays may nest),
// 10 u64, 11 i64, 12 f64. ne[0] is the fastest-varying dimension (a row has ne[0] elements).
//
// Every size read from the file is checked against the bytes left and against hard caps before
// use; errors name the file, the field and its byte offset.
//
// Split models (llama.cpp's gguf-split): NAME-00001-of-0000N.gguf ... NAME-0000N-of-0000N.gguf,
// each a complete GGUF holding only its own tensors, with the keys split.no (u16, 0-based index
// of the file), split.count (u16, N) and split.tensors.count (i32, tensors over all files). The
// first file carries all the model metadata. File::Open on the first file opens the others
// (found by that name pattern) and presents one tensor table over all of them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "quant/types.h"
#include "util/mapped_file.h"
#include "util/status.h"

namespace lamina::gguf {

enum class ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
const char* ValueTypeName(ValueType type);

// Hard caps on untrusted sizes.
constexpr uint64_t kMaxStringLength = 1ull << 24;     // 16 MiB per string
constexpr uint64_t kMaxArrayLength = 1ull << 26;      // 64 Mi elements per array
constexpr uint64_t kMaxKeyValues = 1ull << 20;
constexpr uint64_t kMaxTensors = 1ull << 20;
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayNesting = 8;
// Scalars plus array elements over the whole metadata. A Value is ~100 bytes, so this bounds the
// memory a small file can make the parser allocate (real tokenizers hold well under 2 Mi values).
constexpr uint64_t kMaxMetadataValues = 1ull << 23;

// One metadata value. Scalars are held widened; arrays hold their elements as Values
// (string arrays as strings), with elem_type telling the on-disk element type.
struct Value {
  ValueType type = ValueType::kU8;
  uint64_t u = 0;   // unsigned integer types and bool
  int64_t i = 0;    // signed integer types
  double f = 0.0;   // f32 / f64
  std::string str;  // kString
  ValueType elem_type = ValueType::kU8;  // kArray
  std::vector<Value> array;              // kArray

  bool IsInteger() const;
  // Integer value of any integer type (or bool); false if not an integer or out of range.
  bool AsInt64(int64_t* out) const;
  bool AsDouble(double* out) const;  // f32/f64 or integer
};

struct TensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  int64_t ne[kMaxDims] = {1, 1, 1, 1};  // ne[0] fastest
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;  // relative to the data section (of the split file holding it)
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping; valid while the File lives
  uint32_t split = 0;             // index of the split file holding the data (0 unless split)
};

class File {
 public:
  // Opens and validates the whole header and tensor table. Tensor data is checked to lie
  // inside the file; it is not read. When the file is the first of a split model
  // (split.count > 1), the other files are opened too and tensors() holds the tensors of all
  // of them; any other file of a split model is refused with the name of the first one.
  static Result<std::unique_ptr<File>> Open(const std::string& path);
  // Opens exactly one file and ignores split.* keys (e.g. to look at one file of a split model).
  static Result<std::unique_ptr<File>> OpenSingle(const std::string& path);

  // The header fields below describe the (first) file opened; a tensor's offset is relative to
  // the data section of the file its `split` names.
  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const;
  // Files of a split model (1 when unsplit) and the bytes of all of them together.
  size_t split_count() const { return 1 + other_splits_.size(); }
  uint64_t total_size() const;

  // Metadata in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* Find(std::string_view key) const;
  // Typed getters: an error if the key is missing or has another type (integers convert
  // between widths when the value fits).
  Result<std::string> GetString(std::string_view key) const;
  Result<int64_t> GetInt(std::string_view key) const;
  Result<double> GetFloat(std::string_view key) const;  // f32/f64 (or an integer)
  Result<bool> GetBool(std::string_view key) const;
  // Defaults when the key is absent; an error only when present with a wrong type.
  Result<int64_t> GetIntOr(std::string_view key, int64_t fallback) const;
  Result<double> GetFloatOr(std::string_view key, double fallback) const;
  Result<bool> GetBoolOr(std::string_view key, bool fallback) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* FindTensor(std::string_view name) const;

 private:
  File() = default;
  friend class Parser;
  // Opens files 2..N of the split model this (first) file begins and merges their tensors.
  Status OpenOtherSplits();

  std::string path_;
  std::unique_ptr<MappedFile> mapping_;
  std::vector<std::unique_ptr<MappedFile>> other_splits_;  // [split_count - 1] files 2..N
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Builds a GGUF file in memory and writes it. Used by tests (including deliberately malformed
// files, via RawBytes) and by tools that export models.
class Writer {
 public:
  explicit Writer(uint32_t version = 3) : version_(version) {}

  void SetU32(const std::string& key, uint32_t v);
  void SetI32(const std::string& key, int32_t v);
  void SetU64(const std::string& key, uint64_t v);
  void SetF32(const std::string& key, float v);
  void SetBool(const std::string& key, bool v);
  void SetString(const std::string& key, const std::string& v);
  void SetStringArray(const std::string& key, const std::vector<std::string>& v);
  void SetF32Array(const std::string& key, const std::vector<float>& v);
  void SetI32Array(const std::string& key, const std::vector<int32_t>& v);
  void SetValue(const std::string& key, const Value& v);  // any type, arrays may nest

  // Adds a tensor; data must hold RowSize(type, ne[0]) * ne[1] * ne[2] * ne[3] bytes.
  void AddTensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne,
                 const void* data, size_t n_bytes);

  // The complete file image (header, tensor table, aligned data).
  std::vector<uint8_t> Serialize() const;
  Status WriteFile(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> data;
  };
  uint32_t version_;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace lamina::gguf
