// GGUF parsing and serialization. The parser treats the file as hostile: every read is bounds
// checked first and every count is checked against the bytes left before anything is allocated.
#include "gguf/gguf.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "gguf/ggml_types.h"

namespace lamina::gguf {

namespace {

constexpr uint8_t kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t kDefaultAlignment = 32;
constexpr const char* kAlignmentKey = "general.alignment";
constexpr const char* kSplitNoKey = "split.no";
constexpr const char* kSplitCountKey = "split.count";
constexpr const char* kSplitTensorsKey = "split.tensors.count";
constexpr int64_t kMaxSplits = 65535;  // split.count is a u16

bool IsValidValueType(uint32_t raw) { return raw <= static_cast<uint32_t>(ValueType::kF64); }

// Encoded size of a scalar; 0 for strings and arrays (variable length).
uint64_t ScalarSize(ValueType t) {
  switch (t) {
    case ValueType::kU8:
    case ValueType::kI8:
    case ValueType::kBool:
      return 1;
    case ValueType::kU16:
    case ValueType::kI16:
      return 2;
    case ValueType::kU32:
    case ValueType::kI32:
    case ValueType::kF32:
      return 4;
    case ValueType::kU64:
    case ValueType::kI64:
    case ValueType::kF64:
      return 8;
    case ValueType::kString:
    case ValueType::kArray:
      return 0;
  }
  return 0;
}

// Fewest bytes one encoded value of this type can take; bounds element counts before allocating.
uint64_t MinEncodedSize(ValueType t) {
  if (t == ValueType::kString) return 8;     // u64 length
  if (t == ValueType::kArray) return 4 + 8;  // elem type + count
  return ScalarSize(t);
}

bool IsUnsigned(ValueType t) {
  return t == ValueType::kU8 || t == ValueType::kU16 || t == ValueType::kU32 ||
         t == ValueType::kU64;
}
bool IsSigned(ValueType t) {
  return t == ValueType::kI8 || t == ValueType::kI16 || t == ValueType::kI32 ||
         t == ValueType::kI64;
}

template <typename T>
T LoadLE(const uint8_t* p) {
  static_assert(std::endian::native == std::endian::little, "lamina assumes a little-endian host");
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Decodes one scalar of type `t` at `p` into *v (the caller sets v->type and has checked that
// ScalarSize(t) bytes are there). False for a bool byte other than 0 or 1.
bool DecodeScalar(ValueType t, const uint8_t* p, Value* v) {
  switch (t) {
    case ValueType::kU8:
      v->u = p[0];
      break;
    case ValueType::kI8:
      v->i = static_cast<int8_t>(p[0]);
      break;
    case ValueType::kU16:
      v->u = LoadLE<uint16_t>(p);
      break;
    case ValueType::kI16:
      v->i = LoadLE<int16_t>(p);
      break;
    case ValueType::kU32:
      v->u = LoadLE<uint32_t>(p);
      break;
    case ValueType::kI32:
      v->i = LoadLE<int32_t>(p);
      break;
    case ValueType::kU64:
      v->u = LoadLE<uint64_t>(p);
      break;
    case ValueType::kI64:
      v->i = LoadLE<int64_t>(p);
      break;
    case ValueType::kF32:
      v->f = LoadLE<float>(p);
      break;
    case ValueType::kF64:
      v->f = LoadLE<double>(p);
      break;
    case ValueType::kBool:
      if (p[0] > 1) return false;
      v->u = p[0];
      break;
    case ValueType::kString:
    case ValueType::kArray:
      break;  // not scalars
  }
  return true;
}

std::string Quote(std::string_view s) {
  // Names come from the file: keep the error one printable line.
  std::string out = "\"";
  size_t n = 0;
  for (char c : s) {
    if (++n > 64) {
      out += "...";
      break;
    }
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f || c == '"' || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

}  // namespace

const char* ValueTypeName(ValueType type) {
  switch (type) {
    case ValueType::kU8:
      return "u8";
    case ValueType::kI8:
      return "i8";
    case ValueType::kU16:
      return "u16";
    case ValueType::kI16:
      return "i16";
    case ValueType::kU32:
      return "u32";
    case ValueType::kI32:
      return "i32";
    case ValueType::kF32:
      return "f32";
    case ValueType::kBool:
      return "bool";
    case ValueType::kString:
      return "string";
    case ValueType::kArray:
      return "array";
    case ValueType::kU64:
      return "u64";
    case ValueType::kI64:
      return "i64";
    case ValueType::kF64:
      return "f64";
  }
  return "invalid";
}

bool Value::IsInteger() const { return IsUnsigned(type) || IsSigned(type); }

bool Value::AsInt64(int64_t* out) const {
  if (IsUnsigned(type) || type == ValueType::kBool) {
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (IsSigned(type)) {
    *out = i;
    return true;
  }
  return false;
}

bool Value::AsDouble(double* out) const {
  if (type == ValueType::kF32 || type == ValueType::kF64) {
    *out = f;
    return true;
  }
  if (IsUnsigned(type)) {
    *out = static_cast<double>(u);
    return true;
  }
  if (IsSigned(type)) {
    *out = static_cast<double>(i);
    return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Reader

class Parser {
 public:
  explicit Parser(File* file)
      : file_(file), data_(file->mapping_->data()), size_(file->mapping_->size()) {}

  Status Parse();

 private:
  // One error line: "<path>: <field> at byte <offset>: <message>".
  Error Fail(uint64_t at, const std::string& field, const std::string& msg) const {
    return Error{file_->path_ + ": " + field + " at byte " + std::to_string(at) + ": " + msg};
  }
  uint64_t Left() const { return size_ - pos_; }
  Status Need(uint64_t n, const std::string& field) const {
    if (n <= Left()) return Status::Ok();
    return Fail(
        pos_, field,
        "truncated (need " + std::to_string(n) + " bytes, " + std::to_string(Left()) + " left)");
  }
  template <typename T>
  Status Read(T* out, const std::string& field) {
    Status s = Need(sizeof(T), field);
    if (!s.ok()) return s;
    *out = LoadLE<T>(data_ + pos_);
    pos_ += sizeof(T);
    return Status::Ok();
  }
  Status ReadString(std::string* out, const std::string& field);
  // Reads one value of `type` into *out. `field` names the value; `depth` counts enclosing arrays.
  Status ReadValue(ValueType type, const std::string& field, int depth, Value* out);
  // The pieces of ReadValue: one scalar, an array, and an array of scalars (count already bounded).
  Status ReadScalar(ValueType type, const std::string& field, Value* out);
  Status ReadArray(const std::string& field, int depth, Value* out);
  Status ReadScalarArray(ValueType elem, const std::string& field, Value* out);
  Status ReadTensorInfo(uint64_t index);
  // The sections Parse reads in order; value_at holds each metadata value's byte offset.
  Status ReadHeader(uint64_t* n_tensors, uint64_t* n_kv);
  Status ReadMetadata(uint64_t n_kv, std::vector<uint64_t>* value_at);
  Status ReadAlignment(const std::vector<uint64_t>& value_at);
  Status ReadTensorTable(uint64_t n_tensors);
  Status PlaceTensorData();

  File* file_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t metadata_values_ = 0;  // scalars + array elements so far, against kMaxMetadataValues
  std::vector<uint64_t> offset_field_at_;  // byte offset of each tensor's offset field
};

#define LAMINA_GGUF_TRY(expr)  \
  do {                         \
    Status _st = (expr);       \
    if (!_st.ok()) return _st; \
  } while (0)

Status Parser::ReadString(std::string* out, const std::string& field) {
  const uint64_t at = pos_;
  uint64_t len = 0;
  LAMINA_GGUF_TRY(Read(&len, field));
  if (len > kMaxStringLength) {
    return Fail(at, field,
                "string length " + std::to_string(len) + " exceeds the cap of " +
                    std::to_string(kMaxStringLength));
  }
  if (len > Left()) {
    return Fail(at, field,
                "truncated (string of " + std::to_string(len) + " bytes, " +
                    std::to_string(Left()) + " left)");
  }
  out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
  pos_ += len;
  return Status::Ok();
}

Status Parser::ReadValue(ValueType type, const std::string& field, int depth, Value* out) {
  out->type = type;
  const uint64_t at = pos_;
  if (++metadata_values_ > kMaxMetadataValues) {
    return Fail(at, field,
                "more than " + std::to_string(kMaxMetadataValues) + " metadata values in total");
  }
  switch (type) {
    case ValueType::kString:
      return ReadString(&out->str, field);
    case ValueType::kArray:
      return ReadArray(field, depth, out);
    default:
      return ReadScalar(type, field, out);
  }
}

Status Parser::ReadScalar(ValueType type, const std::string& field, Value* out) {
  const uint64_t at = pos_;
  const uint64_t size = ScalarSize(type);
  if (size == 0) {
    return Fail(at, field, "invalid value type " + std::to_string(static_cast<uint32_t>(type)));
  }
  LAMINA_GGUF_TRY(Need(size, field));
  if (!DecodeScalar(type, data_ + pos_, out)) {
    return Fail(at, field, "bad bool value " + std::to_string(data_[pos_]) + " (must be 0 or 1)");
  }
  pos_ += size;
  return Status::Ok();
}

Status Parser::ReadArray(const std::string& field, int depth, Value* out) {
  const uint64_t at = pos_;
  if (depth >= kMaxArrayNesting) {
    return Fail(at, field,
                "arrays nested deeper than " + std::to_string(kMaxArrayNesting) + " levels");
  }
  uint32_t raw_elem = 0;
  LAMINA_GGUF_TRY(Read(&raw_elem, field + ".elem_type"));
  if (!IsValidValueType(raw_elem)) {
    return Fail(at, field + ".elem_type", "invalid value type " + std::to_string(raw_elem));
  }
  const auto elem = static_cast<ValueType>(raw_elem);
  out->elem_type = elem;
  const uint64_t count_at = pos_;
  uint64_t count = 0;
  LAMINA_GGUF_TRY(Read(&count, field + ".length"));
  if (count > kMaxArrayLength) {
    return Fail(count_at, field + ".length",
                "array length " + std::to_string(count) + " exceeds the cap of " +
                    std::to_string(kMaxArrayLength));
  }
  // count <= 2^26 and the element size <= 12, so the product cannot overflow.
  const uint64_t min_bytes = count * MinEncodedSize(elem);
  if (min_bytes > Left()) {
    return Fail(count_at, field + ".length",
                "array of " + std::to_string(count) + " " + ValueTypeName(elem) +
                    " needs at least " + std::to_string(min_bytes) + " bytes, only " +
                    std::to_string(Left()) + " bytes left");
  }
  out->array.resize(count);
  if (ScalarSize(elem) > 0) return ReadScalarArray(elem, field, out);
  for (uint64_t k = 0; k < count; ++k) {
    // The element field is only needed for errors, but building it is cheap next to the
    // allocation of the element itself.
    LAMINA_GGUF_TRY(
        ReadValue(elem, field + "[" + std::to_string(k) + "]", depth + 1, &out->array[k]));
  }
  return Status::Ok();
}

Status Parser::ReadScalarArray(ValueType elem, const std::string& field, Value* out) {
  // Fast path for numeric arrays: ReadArray has already proven the bounds.
  for (uint64_t k = 0; k < out->array.size(); ++k) {
    if (++metadata_values_ > kMaxMetadataValues) {
      return Fail(pos_, field + "[" + std::to_string(k) + "]",
                  "more than " + std::to_string(kMaxMetadataValues) + " metadata values in total");
    }
    Value& v = out->array[k];
    v.type = elem;
    if (!DecodeScalar(elem, data_ + pos_, &v)) {
      return Fail(pos_, field + "[" + std::to_string(k) + "]",
                  "bad bool value " + std::to_string(data_[pos_]) + " (must be 0 or 1)");
    }
    pos_ += ScalarSize(elem);
  }
  return Status::Ok();
}

Status Parser::ReadTensorInfo(uint64_t index) {
  const std::string base = "tensor[" + std::to_string(index) + "]";
  TensorInfo t;
  const uint64_t name_at = pos_;
  LAMINA_GGUF_TRY(ReadString(&t.name, base + ".name"));
  const std::string field = base + " " + Quote(t.name);
  if (file_->tensor_index_.count(t.name) != 0) {
    return Fail(name_at, base + ".name",
                "duplicate tensor name " + Quote(t.name) + " (first at tensor[" +
                    std::to_string(file_->tensor_index_.find(t.name)->second) + "])");
  }

  const uint64_t dims_at = pos_;
  LAMINA_GGUF_TRY(Read(&t.n_dims, field + ".n_dims"));
  if (t.n_dims > kMaxDims) {
    return Fail(dims_at, field + ".n_dims",
                "n_dims " + std::to_string(t.n_dims) + " exceeds " + std::to_string(kMaxDims));
  }
  uint64_t ne_at[kMaxDims] = {};
  int64_t n_elements = 1;
  for (uint32_t d = 0; d < t.n_dims; ++d) {
    const std::string ne_field = field + ".ne[" + std::to_string(d) + "]";
    ne_at[d] = pos_;
    uint64_t raw = 0;
    LAMINA_GGUF_TRY(Read(&raw, ne_field));
    const auto ne = static_cast<int64_t>(raw);
    if (ne <= 0) {
      return Fail(ne_at[d], ne_field, "dimension " + std::to_string(ne) + " must be positive");
    }
    if (__builtin_mul_overflow(n_elements, ne, &n_elements)) {
      return Fail(ne_at[d], ne_field, "element count overflows int64");
    }
    t.ne[d] = ne;
  }
  t.n_elements = static_cast<uint64_t>(n_elements);

  const uint64_t type_at = pos_;
  uint32_t raw_type = 0;
  LAMINA_GGUF_TRY(Read(&raw_type, field + ".type"));
  // Any type GGML defines is read and sized (the model loader decides what lamina computes).
  const GgmlTypeInfo* traits = FindGgmlType(raw_type);
  if (traits == nullptr) {
    return Fail(type_at, field + ".type", "unknown ggml type " + std::to_string(raw_type));
  }
  t.type = static_cast<GgmlType>(raw_type);
  if (t.ne[0] % traits->block_size != 0) {
    return Fail(t.n_dims > 0 ? ne_at[0] : type_at, field + ".ne[0]",
                "row length " + std::to_string(t.ne[0]) + " is not a multiple of the " +
                    traits->name + " block size " + std::to_string(traits->block_size));
  }
  // Checked byte count: blocks per row * block bytes * rows.
  uint64_t row_bytes = 0;
  uint64_t n_bytes = 0;
  const uint64_t rows = t.n_elements / static_cast<uint64_t>(t.ne[0]);
  if (__builtin_mul_overflow(static_cast<uint64_t>(t.ne[0] / traits->block_size),
                             static_cast<uint64_t>(traits->type_size), &row_bytes) ||
      __builtin_mul_overflow(row_bytes, rows, &n_bytes)) {
    return Fail(type_at, field + ".type", "tensor byte size overflows");
  }
  t.n_bytes = n_bytes;

  const uint64_t offset_at = pos_;
  LAMINA_GGUF_TRY(Read(&t.offset, field + ".offset"));
  if (t.offset % file_->alignment_ != 0) {
    return Fail(offset_at, field + ".offset",
                "data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                    std::to_string(file_->alignment_));
  }
  // The range is checked once the data section's start (after the whole table) is known.
  offset_field_at_.push_back(offset_at);
  file_->tensor_index_.emplace(t.name, file_->tensors_.size());
  file_->tensors_.push_back(std::move(t));
  return Status::Ok();
}

Status Parser::Parse() {
  uint64_t n_tensors = 0;
  uint64_t n_kv = 0;
  LAMINA_GGUF_TRY(ReadHeader(&n_tensors, &n_kv));
  std::vector<uint64_t> value_at;
  LAMINA_GGUF_TRY(ReadMetadata(n_kv, &value_at));
  // Alignment, needed to check tensor offsets.
  LAMINA_GGUF_TRY(ReadAlignment(value_at));
  LAMINA_GGUF_TRY(ReadTensorTable(n_tensors));
  return PlaceTensorData();
}

Status Parser::ReadHeader(uint64_t* n_tensors, uint64_t* n_kv) {
  LAMINA_GGUF_TRY(Need(4, "header.magic"));
  if (std::memcmp(data_, kMagic, 4) != 0) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "bad magic %02x %02x %02x %02x (expected \"GGUF\")", data_[0],
                  data_[1], data_[2], data_[3]);
    return Fail(0, "header.magic", buf);
  }
  pos_ = 4;
  LAMINA_GGUF_TRY(Read(&file_->version_, "header.version"));
  const uint32_t version = file_->version_;
  if (version != 2 && version != 3) {
    std::string why = "unsupported version " + std::to_string(version) + " (lamina reads 2 and 3)";
    if (version == 1) why += "; version 1 used 32-bit counts, re-convert the model";
    if (version == 0x02000000u || version == 0x03000000u) why = "big-endian GGUF is not supported";
    return Fail(4, "header.version", why);
  }
  LAMINA_GGUF_TRY(Read(n_tensors, "header.n_tensors"));
  LAMINA_GGUF_TRY(Read(n_kv, "header.n_kv"));
  if (*n_tensors > kMaxTensors) {
    return Fail(8, "header.n_tensors",
                "tensor count " + std::to_string(*n_tensors) + " exceeds the cap of " +
                    std::to_string(kMaxTensors));
  }
  if (*n_kv > kMaxKeyValues) {
    return Fail(16, "header.n_kv",
                "key/value count " + std::to_string(*n_kv) + " exceeds the cap of " +
                    std::to_string(kMaxKeyValues));
  }
  // Minimal encoding of a kv: key length + type + 1-byte value. n_kv <= 2^20: no overflow.
  constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
  if (*n_kv * kMinKvBytes > Left()) {
    return Fail(16, "header.n_kv",
                std::to_string(*n_kv) + " key/values need at least " +
                    std::to_string(*n_kv * kMinKvBytes) + " bytes, only " + std::to_string(Left()) +
                    " bytes left (truncated file or corrupt count)");
  }
  return Status::Ok();
}

Status Parser::ReadMetadata(uint64_t n_kv, std::vector<uint64_t>* value_at) {
  value_at->reserve(n_kv);
  file_->kv_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string base = "kv[" + std::to_string(k) + "]";
    const uint64_t key_at = pos_;
    std::string key;
    LAMINA_GGUF_TRY(ReadString(&key, base + ".key"));
    if (file_->kv_index_.count(key) != 0) {
      return Fail(key_at, base + ".key",
                  "duplicate metadata key " + Quote(key) + " (first at kv[" +
                      std::to_string(file_->kv_index_.find(key)->second) + "])");
    }
    const std::string field = base + " " + Quote(key);
    const uint64_t type_at = pos_;
    uint32_t raw_type = 0;
    LAMINA_GGUF_TRY(Read(&raw_type, field + ".type"));
    if (!IsValidValueType(raw_type)) {
      return Fail(type_at, field + ".type", "invalid value type " + std::to_string(raw_type));
    }
    value_at->push_back(pos_);
    Value value;
    LAMINA_GGUF_TRY(ReadValue(static_cast<ValueType>(raw_type), field + " value", 0, &value));
    file_->kv_index_.emplace(key, file_->kv_.size());
    file_->kv_.emplace_back(std::move(key), std::move(value));
  }
  return Status::Ok();
}

Status Parser::ReadAlignment(const std::vector<uint64_t>& value_at) {
  auto it = file_->kv_index_.find(kAlignmentKey);
  if (it == file_->kv_index_.end()) return Status::Ok();
  const Value& v = file_->kv_[it->second].second;
  const std::string field =
      "kv[" + std::to_string(it->second) + "] \"" + kAlignmentKey + "\" value";
  const uint64_t at = value_at[it->second];
  if (v.type != ValueType::kU32) {
    return Fail(at, field, std::string("alignment must be u32, got ") + ValueTypeName(v.type));
  }
  if (v.u == 0 || !std::has_single_bit(v.u)) {
    return Fail(at, field, "alignment " + std::to_string(v.u) + " is not a nonzero power of two");
  }
  file_->alignment_ = static_cast<uint32_t>(v.u);
  return Status::Ok();
}

Status Parser::ReadTensorTable(uint64_t n_tensors) {
  // Minimal encoding of an entry: name length + n_dims + type + offset.
  constexpr uint64_t kMinTensorBytes = 8 + 4 + 4 + 8;
  if (n_tensors * kMinTensorBytes > Left()) {
    return Fail(8, "header.n_tensors",
                std::to_string(n_tensors) + " tensors need at least " +
                    std::to_string(n_tensors * kMinTensorBytes) +
                    " bytes after the metadata, only " + std::to_string(Left()) +
                    " bytes left (truncated file or corrupt count)");
  }
  file_->tensors_.reserve(n_tensors);
  offset_field_at_.reserve(n_tensors);
  for (uint64_t t = 0; t < n_tensors; ++t) LAMINA_GGUF_TRY(ReadTensorInfo(t));
  return Status::Ok();
}

Status Parser::PlaceTensorData() {
  // Data section: the header end rounded up to the alignment (pos_ <= size_, so no overflow).
  const uint64_t align = file_->alignment_;
  file_->data_offset_ = (pos_ + align - 1) / align * align;
  for (size_t k = 0; k < file_->tensors_.size(); ++k) {
    TensorInfo& t = file_->tensors_[k];
    const uint64_t offset_at = offset_field_at_[k];
    const std::string field = "tensor[" + std::to_string(k) + "] " + Quote(t.name) + ".offset";
    uint64_t begin = 0;
    uint64_t end = 0;
    if (__builtin_add_overflow(file_->data_offset_, t.offset, &begin) ||
        __builtin_add_overflow(begin, t.n_bytes, &end) || end > size_) {
      return Fail(offset_at, field,
                  "data [" + std::to_string(t.offset) + ", +" + std::to_string(t.n_bytes) +
                      ") at file offset " + std::to_string(file_->data_offset_) +
                      " extends past the end of the file (" + std::to_string(size_) + " bytes)");
    }
    t.data = data_ + begin;
  }
  return Status::Ok();
}

#undef LAMINA_GGUF_TRY

Result<std::unique_ptr<File>> File::OpenSingle(const std::string& path) {
  auto mapped = MappedFile::Open(path);
  if (!mapped.ok()) return mapped.error();
  std::unique_ptr<File> file(new File());
  file->path_ = path;
  file->mapping_ = std::move(mapped).value();
  Parser parser(file.get());
  Status st = parser.Parse();
  if (!st.ok()) return st.error();
  return file;
}

namespace {

// gguf-split's file name ending for file `index` (0-based) of `count`: "-%05d-of-%05d.gguf".
std::string SplitSuffix(int64_t index, int64_t count) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "-%05lld-of-%05lld.gguf", static_cast<long long>(index + 1),
                static_cast<long long>(count));
  return buf;
}

// split.count of a file: 1 when absent; an error unless an integer in [1, kMaxSplits].
Result<int64_t> SplitCount(const File& file) {
  Result<int64_t> count = file.GetIntOr(kSplitCountKey, 1);
  if (!count.ok()) return count.error();
  if (*count < 1 || *count > kMaxSplits) {
    return Error{file.path() + ": metadata key " + Quote(kSplitCountKey) + ": " +
                 std::to_string(*count) + " is not in [1, " + std::to_string(kMaxSplits) + "]"};
  }
  return *count;
}

}  // namespace

Result<std::unique_ptr<File>> File::Open(const std::string& path) {
  Result<std::unique_ptr<File>> file = OpenSingle(path);
  if (!file.ok()) return file.error();
  Result<int64_t> count = SplitCount(**file);
  if (!count.ok()) return count.error();
  if (*count == 1) return file;
  Status st = (*file)->OpenOtherSplits();
  if (!st.ok()) return st.error();
  return file;
}

Status File::OpenOtherSplits() {
  Result<int64_t> count = SplitCount(*this);
  if (!count.ok()) return count.error();
  const int64_t n = *count;
  const std::string of_n = " of " + std::to_string(n);
  Result<int64_t> no = GetInt(kSplitNoKey);
  if (!no.ok()) return no.error();
  if (*no < 0 || *no >= n) {
    return Error{path_ + ": metadata key " + Quote(kSplitNoKey) + ": " + std::to_string(*no) +
                 " is not below split.count " + std::to_string(n)};
  }
  if (*no != 0) {
    std::string first = "its first file";
    if (const std::string suffix = SplitSuffix(*no, n); path_.ends_with(suffix)) {
      first += " " + path_.substr(0, path_.size() - suffix.size()) + SplitSuffix(0, n);
    }
    return Error{path_ + ": file " + std::to_string(*no + 1) + of_n +
                 " of a split model (split.no " + std::to_string(*no) + "); open " + first};
  }
  const std::string first_suffix = SplitSuffix(0, n);
  if (!path_.ends_with(first_suffix)) {
    return Error{path_ + ": split.count is " + std::to_string(n) +
                 " but the file name does not end in " + first_suffix +
                 ", so the other split files cannot be found"};
  }
  const std::string prefix = path_.substr(0, path_.size() - first_suffix.size());
  Result<int64_t> total = GetIntOr(kSplitTensorsKey, -1);  // -1: absent, not checked
  if (!total.ok()) return total.error();

  std::vector<std::string> paths = {path_};  // [n] each split file's path, for errors
  for (int64_t k = 1; k < n; ++k) {
    const std::string part_path = prefix + SplitSuffix(k, n);
    Result<std::unique_ptr<File>> opened = OpenSingle(part_path);
    if (!opened.ok()) {
      return Error{path_ + ": split file " + std::to_string(k + 1) + of_n + ": " +
                   opened.error().message};
    }
    File& part = **opened;
    Result<int64_t> part_count = part.GetInt(kSplitCountKey);
    if (!part_count.ok()) return part_count.error();
    if (*part_count != n) {
      return Error{part_path + ": metadata key " + Quote(kSplitCountKey) + ": " +
                   std::to_string(*part_count) + ", but the first file " + path_ + " has " +
                   std::to_string(n)};
    }
    Result<int64_t> part_no = part.GetInt(kSplitNoKey);
    if (!part_no.ok()) return part_no.error();
    if (*part_no != k) {
      return Error{part_path + ": metadata key " + Quote(kSplitNoKey) + ": " +
                   std::to_string(*part_no) + ", expected " + std::to_string(k) + " (file " +
                   std::to_string(k + 1) + of_n + ")"};
    }
    for (TensorInfo& t : part.tensors_) {
      if (auto it = tensor_index_.find(t.name); it != tensor_index_.end()) {
        return Error{part_path + ": tensor " + Quote(t.name) + " is also in " +
                     paths[tensors_[it->second].split] +
                     " (each tensor must be in one split file only)"};
      }
      t.split = static_cast<uint32_t>(k);
      tensor_index_.emplace(t.name, tensors_.size());
      tensors_.push_back(std::move(t));
    }
    paths.push_back(part_path);
    // The tensors point into this mapping: keep it alive with the first file.
    other_splits_.push_back(std::move(part.mapping_));
  }
  if (*total >= 0 && static_cast<uint64_t>(*total) != tensors_.size()) {
    return Error{path_ + ": metadata key " + Quote(kSplitTensorsKey) + ": " +
                 std::to_string(*total) + ", but the " + std::to_string(n) + " split files hold " +
                 std::to_string(tensors_.size()) + " tensors"};
  }
  return Status::Ok();
}

uint64_t File::file_size() const { return mapping_ ? mapping_->size() : 0; }

uint64_t File::total_size() const {
  uint64_t total = file_size();
  for (const std::unique_ptr<MappedFile>& m : other_splits_) total += m->size();
  return total;
}

const Value* File::Find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo* File::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
Error KeyError(const std::string& path, std::string_view key, const std::string& msg) {
  return Error{path + ": metadata key " + Quote(key) + ": " + msg};
}
Error WrongType(const std::string& path, std::string_view key, const Value& v,
                const char* expected) {
  return KeyError(path, key,
                  std::string("has type ") + ValueTypeName(v.type) + ", expected " + expected);
}
}  // namespace

Result<std::string> File::GetString(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return KeyError(path_, key, "missing");
  if (v->type != ValueType::kString) return WrongType(path_, key, *v, "string");
  return v->str;
}

Result<int64_t> File::GetInt(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return KeyError(path_, key, "missing");
  int64_t out = 0;
  if (v->IsInteger() || v->type == ValueType::kBool) {
    if (!v->AsInt64(&out)) {
      return KeyError(path_, key, "value " + std::to_string(v->u) + " does not fit in int64");
    }
    return out;
  }
  return WrongType(path_, key, *v, "an integer");
}

Result<double> File::GetFloat(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return KeyError(path_, key, "missing");
  double out = 0;
  if (!v->AsDouble(&out)) return WrongType(path_, key, *v, "a number");
  return out;
}

Result<bool> File::GetBool(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return KeyError(path_, key, "missing");
  if (v->type != ValueType::kBool) return WrongType(path_, key, *v, "bool");
  return v->u != 0;
}

Result<int64_t> File::GetIntOr(std::string_view key, int64_t fallback) const {
  if (Find(key) == nullptr) return fallback;
  return GetInt(key);
}

Result<double> File::GetFloatOr(std::string_view key, double fallback) const {
  if (Find(key) == nullptr) return fallback;
  return GetFloat(key);
}

Result<bool> File::GetBoolOr(std::string_view key, bool fallback) const {
  if (Find(key) == nullptr) return fallback;
  return GetBool(key);
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

template <typename T>
void Put(std::vector<uint8_t>* out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out->insert(out->end(), b, b + sizeof(T));
}

void PutString(std::vector<uint8_t>* out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out->insert(out->end(), s.begin(), s.end());
}

// Writes the payload of `v` as type `type` (for array elements, the array's elem_type).
void PutValue(std::vector<uint8_t>* out, ValueType type, const Value& v) {
  switch (type) {
    case ValueType::kU8:
      Put<uint8_t>(out, static_cast<uint8_t>(v.u));
      break;
    case ValueType::kI8:
      Put<int8_t>(out, static_cast<int8_t>(v.i));
      break;
    case ValueType::kU16:
      Put<uint16_t>(out, static_cast<uint16_t>(v.u));
      break;
    case ValueType::kI16:
      Put<int16_t>(out, static_cast<int16_t>(v.i));
      break;
    case ValueType::kU32:
      Put<uint32_t>(out, static_cast<uint32_t>(v.u));
      break;
    case ValueType::kI32:
      Put<int32_t>(out, static_cast<int32_t>(v.i));
      break;
    case ValueType::kU64:
      Put<uint64_t>(out, v.u);
      break;
    case ValueType::kI64:
      Put<int64_t>(out, v.i);
      break;
    case ValueType::kF32:
      Put<float>(out, static_cast<float>(v.f));
      break;
    case ValueType::kF64:
      Put<double>(out, v.f);
      break;
    case ValueType::kBool:
      Put<uint8_t>(out, v.u != 0 ? 1 : 0);
      break;
    case ValueType::kString:
      PutString(out, v.str);
      break;
    case ValueType::kArray:
      Put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
      Put<uint64_t>(out, v.array.size());
      for (const Value& e : v.array) PutValue(out, v.elem_type, e);
      break;
  }
}

void PadTo(std::vector<uint8_t>* out, uint64_t align) {
  while (out->size() % align != 0) out->push_back(0);
}

}  // namespace

void Writer::SetValue(const std::string& key, const Value& v) {
  for (auto& [k, existing] : kv_) {
    if (k == key) {
      existing = v;
      return;
    }
  }
  kv_.emplace_back(key, v);
}

void Writer::SetU32(const std::string& key, uint32_t v) {
  Value x;
  x.type = ValueType::kU32;
  x.u = v;
  SetValue(key, x);
}

void Writer::SetI32(const std::string& key, int32_t v) {
  Value x;
  x.type = ValueType::kI32;
  x.i = v;
  SetValue(key, x);
}

void Writer::SetU64(const std::string& key, uint64_t v) {
  Value x;
  x.type = ValueType::kU64;
  x.u = v;
  SetValue(key, x);
}

void Writer::SetF32(const std::string& key, float v) {
  Value x;
  x.type = ValueType::kF32;
  x.f = v;
  SetValue(key, x);
}

void Writer::SetBool(const std::string& key, bool v) {
  Value x;
  x.type = ValueType::kBool;
  x.u = v ? 1 : 0;
  SetValue(key, x);
}

void Writer::SetString(const std::string& key, const std::string& v) {
  Value x;
  x.type = ValueType::kString;
  x.str = v;
  SetValue(key, x);
}

void Writer::SetStringArray(const std::string& key, const std::vector<std::string>& v) {
  Value x;
  x.type = ValueType::kArray;
  x.elem_type = ValueType::kString;
  x.array.resize(v.size());
  for (size_t k = 0; k < v.size(); ++k) {
    x.array[k].type = ValueType::kString;
    x.array[k].str = v[k];
  }
  SetValue(key, x);
}

void Writer::SetF32Array(const std::string& key, const std::vector<float>& v) {
  Value x;
  x.type = ValueType::kArray;
  x.elem_type = ValueType::kF32;
  x.array.resize(v.size());
  for (size_t k = 0; k < v.size(); ++k) {
    x.array[k].type = ValueType::kF32;
    x.array[k].f = v[k];
  }
  SetValue(key, x);
}

void Writer::SetI32Array(const std::string& key, const std::vector<int32_t>& v) {
  Value x;
  x.type = ValueType::kArray;
  x.elem_type = ValueType::kI32;
  x.array.resize(v.size());
  for (size_t k = 0; k < v.size(); ++k) {
    x.array[k].type = ValueType::kI32;
    x.array[k].i = v[k];
  }
  SetValue(key, x);
}

void Writer::AddTensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne,
                       const void* data, size_t n_bytes) {
  LAMINA_CHECK(ne.size() <= kMaxDims);
  int64_t rows = 1;
  for (size_t d = 1; d < ne.size(); ++d) rows *= ne[d];
  const int64_t ne0 = ne.empty() ? 1 : ne[0];
  LAMINA_CHECK(RowSize(type, ne0) * static_cast<size_t>(rows) == n_bytes);
  PendingTensor t;
  t.name = name;
  t.type = type;
  t.ne = ne;
  const auto* p = static_cast<const uint8_t*>(data);
  t.data.assign(p, p + n_bytes);
  tensors_.push_back(std::move(t));
}

std::vector<uint8_t> Writer::Serialize() const {
  // Pad with the caller's alignment when it is usable; an invalid one is still written so that
  // tests can produce files the reader must refuse.
  uint64_t align = kDefaultAlignment;
  for (const auto& [k, v] : kv_) {
    if (k == kAlignmentKey && v.type == ValueType::kU32 && v.u != 0 && std::has_single_bit(v.u)) {
      align = v.u;
    }
  }

  std::vector<uint8_t> out;
  out.insert(out.end(), kMagic, kMagic + 4);
  Put<uint32_t>(&out, version_);
  Put<uint64_t>(&out, tensors_.size());
  Put<uint64_t>(&out, kv_.size());
  for (const auto& [k, v] : kv_) {
    PutString(&out, k);
    Put<uint32_t>(&out, static_cast<uint32_t>(v.type));
    PutValue(&out, v.type, v);
  }
  uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    PutString(&out, t.name);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.ne.size()));
    for (int64_t n : t.ne) Put<uint64_t>(&out, static_cast<uint64_t>(n));
    Put<uint32_t>(&out, static_cast<uint32_t>(t.type));
    Put<uint64_t>(&out, offset);
    offset += (t.data.size() + align - 1) / align * align;
  }
  if (tensors_.empty()) return out;
  PadTo(&out, align);
  for (size_t k = 0; k < tensors_.size(); ++k) {
    out.insert(out.end(), tensors_[k].data.begin(), tensors_[k].data.end());
    // No padding after the last tensor: the file ends with the data, so any truncation is
    // detectable.
    if (k + 1 < tensors_.size()) PadTo(&out, align);
  }
  return out;
}

Status Writer::WriteFile(const std::string& path) const {
  const std::vector<uint8_t> bytes = Serialize();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return Error{path + ": cannot create: " + std::strerror(errno)};
  const size_t written = bytes.empty() ? 0 : std::fwrite(bytes.data(), 1, bytes.size(), f);
  const bool write_ok = written == bytes.size();
  const int saved_errno = errno;
  if (std::fclose(f) != 0 || !write_ok) {
    return Error{path + ": write failed: " + std::strerror(write_ok ? errno : saved_errno)};
  }
  return Status::Ok();
}

}  // namespace lamina::gguf
