// Error values for untrusted input (files, CLI, HTTP): a Result<T> holds a value or an Error
// whose message says what was wrong and where. Broken invariants use check.h instead.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "util/check.h"

namespace lamina {

struct Error {
  std::string message;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  const Error& error() const {
    LAMINA_CHECK(!ok());
    return std::get<Error>(v_);
  }
  T& value() & {
    LAMINA_CHECK(ok());
    return std::get<T>(v_);
  }
  const T& value() const& {
    LAMINA_CHECK(ok());
    return std::get<T>(v_);
  }
  T&& value() && {
    LAMINA_CHECK(ok());
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Error> v_;
};

// Result<void> equivalent.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT: implicit by design
  static Status Ok() { return Status(); }
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const {
    LAMINA_CHECK(!ok_);
    return error_;
  }

 private:
  Error error_;
  bool ok_ = true;
};

}  // namespace lamina
