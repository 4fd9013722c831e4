// Available memory, byte sizes and the memory limit (memory.h).
#include "util/memory.h"

#include <cctype>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace lamina {

uint64_t AvailableMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value = 0;
  std::string unit;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    if (!(ss >> key >> value)) continue;
    if (key == "MemAvailable:") {
      ss >> unit;
      return unit == "kB" ? SatMul(value, 1024) : value;
    }
  }
  return 0;
}

Result<uint64_t> ParseByteSize(const std::string& text) {
  const Error bad{"bad size \"" + text +
                  "\" (expected bytes with an optional K, M, G or T suffix, e.g. 8G)"};
  size_t i = 0;
  uint64_t n = 0;
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return bad;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    if (__builtin_mul_overflow(n, 10, &n) || __builtin_add_overflow(n, text[i] - '0', &n))
      return bad;
    ++i;
  }
  std::string suffix = text.substr(i);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suffix.ends_with("IB"))
    suffix.resize(suffix.size() - 2);
  else if (suffix.ends_with("B"))
    suffix.resize(suffix.size() - 1);
  int shift = 0;
  if (suffix == "K")
    shift = 10;
  else if (suffix == "M")
    shift = 20;
  else if (suffix == "G")
    shift = 30;
  else if (suffix == "T")
    shift = 40;
  else if (!suffix.empty())
    return bad;
  if (shift > 0 && (n >> (64 - shift)) != 0) return bad;
  return n << shift;
}

std::string FormatBytes(uint64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= (1ull << 30)) {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", b / (1ull << 30));
  } else if (bytes >= (1ull << 20)) {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", b / (1ull << 20));
  } else if (bytes >= (1ull << 10)) {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", b / (1ull << 10));
  } else {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  }
  return buf;
}

MemoryLimit DefaultMemoryLimit() {
  MemoryLimit limit;
  const uint64_t avail = AvailableMemoryBytes();
  if (avail == 0) {
    limit.source = "unlimited: MemAvailable unreadable";
    return limit;
  }
  limit.bytes = avail / 10 * 9;
  limit.source = "90% of MemAvailable";
  return limit;
}

Result<MemoryLimit> ResolveMemoryLimit(const std::string& option, const char* env) {
  std::string value = option;
  std::string name = "--mem-limit";
  if (value.empty() && env != nullptr && env[0] != '\0') {
    value = env;
    name = "LAMINA_MEM_LIMIT";
  }
  if (value.empty()) return DefaultMemoryLimit();
  MemoryLimit limit;
  limit.source = "set by " + name;
  if (value == "none") return limit;
  Result<uint64_t> bytes = ParseByteSize(value);
  if (!bytes.ok()) return Error{name + ": " + bytes.error().message};
  limit.bytes = *bytes;
  return limit;
}

}  // namespace lamina
