// Wall-clock timing helpers.
#pragma once

#include <chrono>

namespace lamina {

inline double NowSeconds() {
  using Clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

}  // namespace lamina
