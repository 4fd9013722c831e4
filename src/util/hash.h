// XXH64 (Yann Collet's xxHash, 64-bit): checksums of session-file sections and the model
// identity hash. Incremental: Update any number of times, then Digest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace lamina {

class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0) : seed_(seed) {
    v_[0] = seed + kP1 + kP2;
    v_[1] = seed + kP2;
    v_[2] = seed;
    v_[3] = seed - kP1;
  }

  void Update(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    total_ += n;
    if (buffered_ + n < 32) {
      std::memcpy(buf_ + buffered_, p, n);
      buffered_ += n;
      return;
    }
    if (buffered_ > 0) {
      const size_t fill = 32 - buffered_;
      std::memcpy(buf_ + buffered_, p, fill);
      Stripe(buf_);
      p += fill;
      n -= fill;
      buffered_ = 0;
    }
    while (n >= 32) {
      Stripe(p);
      p += 32;
      n -= 32;
    }
    std::memcpy(buf_, p, n);
    buffered_ = n;
  }
  void Update(std::string_view s) { Update(s.data(), s.size()); }
  template <typename T>
  void UpdatePod(const T& v) {
    Update(&v, sizeof(T));
  }

  uint64_t Digest() const {
    uint64_t h;
    if (total_ >= 32) {
      h = Rotl(v_[0], 1) + Rotl(v_[1], 7) + Rotl(v_[2], 12) + Rotl(v_[3], 18);
      for (uint64_t v : v_) h = (h ^ Round(0, v)) * kP1 + kP4;
    } else {
      h = seed_ + kP5;
    }
    h += total_;
    const uint8_t* p = buf_;
    size_t n = buffered_;
    while (n >= 8) {
      h ^= Round(0, Load64(p));
      h = Rotl(h, 27) * kP1 + kP4;
      p += 8;
      n -= 8;
    }
    if (n >= 4) {
      h ^= static_cast<uint64_t>(Load32(p)) * kP1;
      h = Rotl(h, 23) * kP2 + kP3;
      p += 4;
      n -= 4;
    }
    while (n > 0) {
      h ^= (*p) * kP5;
      h = Rotl(h, 11) * kP1;
      ++p;
      --n;
    }
    h ^= h >> 33;
    h *= kP2;
    h ^= h >> 29;
    h *= kP3;
    h ^= h >> 32;
    return h;
  }

  static uint64_t Of(const void* data, size_t n, uint64_t seed = 0) {
    Xxh64 x(seed);
    x.Update(data, n);
    return x.Digest();
  }

 private:
  static constexpr uint64_t kP1 = 11400714785074694791ull;
  static constexpr uint64_t kP2 = 14029467366897019727ull;
  static constexpr uint64_t kP3 = 1609587929392839161ull;
  static constexpr uint64_t kP4 = 9650029242287828579ull;
  static constexpr uint64_t kP5 = 2870177450012600261ull;
  static uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
  static uint64_t Round(uint64_t acc, uint64_t in) { return Rotl(acc + in * kP2, 31) * kP1; }
  static uint64_t Load64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
  }
  static uint32_t Load32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  void Stripe(const uint8_t* p) {
    for (int i = 0; i < 4; ++i) v_[i] = Round(v_[i], Load64(p + 8 * i));
  }

  uint64_t seed_;
  uint64_t v_[4];
  uint8_t buf_[32] = {};
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

}  // namespace lamina
