// The i-quant codebooks as the kernels read them: each grid entry's values packed little-endian
// into one integer (byte j = value j), expanded at compile time from the measured codebook data
// in iq_codebooks.inc, and the sign rule of the 7-bit sign indices.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace lamina::quant_internal {

#include "quant/iq_codebooks.inc"

// Entry e of a grid of W-value entries (W = 8: 2-bit level indices; W = 4: 3-bit), value j
// stored as the byte (levels[index] * kMul + kAdd) mod 256.
template <typename Word, int W, int kMul = 1, int kAdd = 0, size_t N, size_t L>
constexpr std::array<Word, N> ExpandGrid(const uint16_t (&codes)[N], const int (&levels)[L]) {
  constexpr int kBits = W == 8 ? 2 : 3;
  std::array<Word, N> out{};
  for (size_t e = 0; e < N; ++e) {
    Word v = 0;
    for (int j = 0; j < W; ++j) {
      const int level = levels[(codes[e] >> (kBits * j)) & ((1 << kBits) - 1)];
      v |= static_cast<Word>(static_cast<uint8_t>(level * kMul + kAdd)) << (8 * j);
    }
    out[e] = v;
  }
  return out;
}

// Unsigned magnitudes (IQ2: 8, 25, 43; IQ3_XXS: 4..62; IQ3_S: 1..15).
inline constexpr std::array<uint64_t, 256> kIq2xxsGrid =
    ExpandGrid<uint64_t, 8>(kIq2xxsCodes, kIq2xxsLevels);
inline constexpr std::array<uint64_t, 512> kIq2xsGrid =
    ExpandGrid<uint64_t, 8>(kIq2xsCodes, kIq2xsLevels);
inline constexpr std::array<uint64_t, 1024> kIq2sGrid =
    ExpandGrid<uint64_t, 8>(kIq2sCodes, kIq2sLevels);
inline constexpr std::array<uint32_t, 256> kIq3xxsGrid =
    ExpandGrid<uint32_t, 4>(kIq3xxsCodes, kIq3xxsLevels);
inline constexpr std::array<uint32_t, 512> kIq3sGrid =
    ExpandGrid<uint32_t, 4>(kIq3sCodes, kIq3sLevels);
// IQ1_S / IQ1_M: signed bytes -1, 0, 1 (kIq1Grid) and the same times 8 (kIq1Grid8: the kernels
// add the delta +-1 to it, computing 8 * (grid + delta) in integers).
inline constexpr std::array<uint64_t, 2048> kIq1Grid =
    ExpandGrid<uint64_t, 8>(kIq1sCodes, kIq1sLevels);
inline constexpr std::array<uint64_t, 2048> kIq1Grid8 =
    ExpandGrid<uint64_t, 8, 8>(kIq1sCodes, kIq1sLevels);
// The same with the delta added: entry e is 8 * grid[e] + 1 in every byte, entry 2048 + e is
// 8 * grid[e] - 1 (index = grid index | negative-delta bit << 11), for the AVX2 kernels.
constexpr std::array<uint64_t, 4096> MakeIq1Grid8Delta() {
  constexpr auto plus = ExpandGrid<uint64_t, 8, 8, 1>(kIq1sCodes, kIq1sLevels);
  constexpr auto minus = ExpandGrid<uint64_t, 8, 8, -1>(kIq1sCodes, kIq1sLevels);
  std::array<uint64_t, 4096> t{};
  for (size_t e = 0; e < 2048; ++e) {
    t[e] = plus[e];
    t[2048 + e] = minus[e];
  }
  return t;
}
inline constexpr std::array<uint64_t, 4096> kIq1Grid8Delta = MakeIq1Grid8Delta();

// The 8 sign bits of 7-bit sign index s: s plus bit 7 set when s has an odd number of set bits
// (so every entry negates an even number of values).
constexpr uint8_t IqSignRule(uint32_t s) {
  s &= 127;
  int odd = 0;
  for (int j = 0; j < 7; ++j) odd ^= (s >> j) & 1;
  return static_cast<uint8_t>(s | (odd << 7));
}
constexpr std::array<uint8_t, 128> MakeIqSigns() {
  std::array<uint8_t, 128> t{};
  for (uint32_t s = 0; s < 128; ++s) t[s] = IqSignRule(s);
  return t;
}
inline constexpr std::array<uint8_t, 128> kIqSigns = MakeIqSigns();
inline uint8_t IqSignBits(uint32_t s) { return kIqSigns[s & 127]; }
// The same as byte masks (byte j 0xFF where value j is negated), for the SIMD kernels.
constexpr std::array<uint64_t, 128> MakeIqSignMasks() {
  std::array<uint64_t, 128> t{};
  for (uint32_t s = 0; s < 128; ++s) {
    for (int j = 0; j < 8; ++j) {
      if ((IqSignRule(s) >> j) & 1) t[s] |= uint64_t{0xFF} << (8 * j);
    }
  }
  return t;
}
inline constexpr std::array<uint64_t, 128> kIqSignMasks = MakeIqSignMasks();

}  // namespace lamina::quant_internal
