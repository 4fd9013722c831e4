// Bounded JSON parsing: nlohmann's DOM builder behind a SAX handler that counts open arrays and
// objects and stops the (iterative) parser at the first one past the limit.
#include "json_limits.h"

#include <utility>
#include <vector>

namespace lamina::cli {
namespace {

// nlohmann's own DOM builder (what json::parse uses) with a depth count in front.
template <class Json>
class BoundedSax {
 public:
  using number_integer_t = typename Json::number_integer_t;
  using number_unsigned_t = typename Json::number_unsigned_t;
  using number_float_t = typename Json::number_float_t;
  using string_t = typename Json::string_t;
  using binary_t = typename Json::binary_t;

  BoundedSax(Json* out, size_t max_depth)
      : dom_(*out, /*allow_exceptions=*/false), max_depth_(max_depth) {}

  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(number_float_t v, const string_t& s) { return dom_.number_float(v, s); }
  bool string(string_t& v) { return dom_.string(v); }
  bool binary(binary_t& v) { return dom_.binary(v); }
  bool start_object(std::size_t n) {
    if (!Open()) return false;
    members_.push_back(0);
    return dom_.start_object(n);
  }
  // ordered_json finds a key's place by a linear search of its object: inserting the k-th member
  // costs k comparisons, which members_ and member_work_ bound.
  bool key(string_t& k) {
    size_t& n = members_.back();
    member_work_ += n;
    if (++n > kMaxJsonObjectMembers) {
      limit_error_ = "has an object of over " + std::to_string(kMaxJsonObjectMembers) + " members";
      return false;
    }
    if (member_work_ > kMaxJsonMemberWork) {
      limit_error_ = "has objects holding too many members together (limit: " +
                     std::to_string(kMaxJsonMemberWork) + " key comparisons)";
      return false;
    }
    return dom_.key(k);
  }
  bool end_object() {
    --depth_;
    members_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return Open() && dom_.start_array(n); }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  template <class Exception>
  bool parse_error(std::size_t at, const std::string& token, const Exception& e) {
    parse_error_ = e.what();
    return dom_.parse_error(at, token, e);
  }

  bool too_deep() const { return too_deep_; }
  const std::string& limit_error() const { return limit_error_; }
  const std::string& parse_error_text() const { return parse_error_; }

 private:
  bool Open() {
    if (++depth_ > max_depth_) {
      too_deep_ = true;
      return false;
    }
    return true;
  }

  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  size_t max_depth_;
  size_t depth_ = 0;
  bool too_deep_ = false;
  std::vector<size_t> members_;  // [depth of open objects]: members read so far in each
  size_t member_work_ = 0;
  std::string limit_error_;
  std::string parse_error_;
};

template <class Json>
bool ParseBounded(std::string_view text, size_t max_depth, Json* out, std::string* error,
                  std::string_view subject) {
  Json parsed;
  BoundedSax<Json> sax(&parsed, max_depth);
  const bool ok =
      Json::sax_parse(text.begin(), text.end(), &sax, nlohmann::json::input_format_t::json,
                      /*strict=*/true);
  if (sax.too_deep()) {
    *error = std::string(subject) + " nests deeper than " + std::to_string(max_depth) + " levels";
    return false;
  }
  if (!sax.limit_error().empty()) {
    *error = std::string(subject) + " " + sax.limit_error();
    return false;
  }
  if (!ok) {
    *error = std::string(subject) + " is not valid JSON";
    if (!sax.parse_error_text().empty()) *error += ": " + sax.parse_error_text();
    return false;
  }
  *out = std::move(parsed);
  return true;
}

template <class Json>
bool DepthWithin(const Json& value, size_t max_depth) {
  // (node, its depth): depth counts the arrays and objects down to and including the node.
  std::vector<std::pair<const Json*, size_t>> todo{{&value, 0}};
  while (!todo.empty()) {
    auto [v, depth] = todo.back();
    todo.pop_back();
    if (!v->is_structured()) continue;
    if (depth + 1 > max_depth) return false;
    for (const Json& child : *v) todo.push_back({&child, depth + 1});
  }
  return true;
}

}  // namespace

bool ParseJsonBounded(std::string_view text, size_t max_depth, nlohmann::json* out,
                      std::string* error, std::string_view subject) {
  return ParseBounded(text, max_depth, out, error, subject);
}

bool ParseJsonBounded(std::string_view text, size_t max_depth, nlohmann::ordered_json* out,
                      std::string* error, std::string_view subject) {
  return ParseBounded(text, max_depth, out, error, subject);
}

bool JsonDepthWithin(const nlohmann::json& value, size_t max_depth) {
  return DepthWithin(value, max_depth);
}

bool JsonDepthWithin(const nlohmann::ordered_json& value, size_t max_depth) {
  return DepthWithin(value, max_depth);
}

}  // namespace lamina::cli
