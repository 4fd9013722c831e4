// Scalar kernels of the lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M):
// the reference twins of iquants_avx2.cpp / iquants_avx512.cpp. Each super-block is decoded into
// 256 signed integer weights w and sixteen 3- or 4-bit scales s (one per 16 values); the dot is
// then one exact integer per super-block, sum over halves of (2s + 1) * sum(w * q8), and the float
// steps are GGML's generic code's (llama.cpp 3f545be): sumf += (d * d_a) * isum per super-block,
// times 1/8 (IQ2), 1/4 (IQ3_XXS) or 1 (IQ3_S) at the end. IQ1: w = 8 * (grid + delta), so isum is
// 8 * sumi + sumi1 in GGML's names and (d * d_a) * (isum / 8) equals its (d * d_a) * (sumi + sumi1
// / 8) exactly (|isum| < 2^24).
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quant/iq_grids.h"
#include "quant/kernel_registry.h"
#include "quant/quant.h"
#include "quant/types.h"
#include "util/check.h"
#include "util/fp16.h"

namespace lamina::quant_internal {
namespace {

// A decoded super-block: w[i] the signed integer weight of value i, s[h] the raw scale of
// values 16h..16h+15.
struct IqBlock {
  int8_t w[kQK_K];  // [256]
  uint8_t s[16];    // [16 halves of 16 values]
};

// Writes the 8 bytes of grid entry `g` to w with the signs of `signs` (bit j negates byte j).
inline void PutSigned8(uint64_t g, uint8_t signs, int8_t* w) {
  for (int j = 0; j < 8; ++j) {
    const int v = static_cast<int>((g >> (8 * j)) & 0xFF);
    w[j] = static_cast<int8_t>((signs >> j) & 1 ? -v : v);
  }
}

// Two 4-value entries (IQ3): values 0..3 from g1, 4..7 from g2.
inline void PutSigned4x2(uint32_t g1, uint32_t g2, uint8_t signs, int8_t* w) {
  PutSigned8(static_cast<uint64_t>(g1) | static_cast<uint64_t>(g2) << 32, signs, w);
}

void Decode(const BlockIQ2_XXS& b, IqBlock* out) {
  for (int g = 0; g < 8; ++g) {
    uint32_t a, sw;
    std::memcpy(&a, b.qs + 4 * g, 4);
    std::memcpy(&sw, b.qs + 4 * g + 2, 4);
    for (int l = 0; l < 4; ++l) {
      PutSigned8(kIq2xxsGrid[(a >> (8 * l)) & 0xFF], IqSignBits(sw >> (7 * l)),
                 out->w + 32 * g + 8 * l);
    }
    out->s[2 * g] = out->s[2 * g + 1] = static_cast<uint8_t>(sw >> 28);
  }
}

void Decode(const BlockIQ2_XS& b, IqBlock* out) {
  for (int i = 0; i < 32; ++i) {
    PutSigned8(kIq2xsGrid[b.qs[i] & 511], IqSignBits(b.qs[i] >> 9), out->w + 8 * i);
  }
  for (int g = 0; g < 8; ++g) {
    out->s[2 * g] = b.scales[g] & 0xF;
    out->s[2 * g + 1] = b.scales[g] >> 4;
  }
}

void Decode(const BlockIQ2_S& b, IqBlock* out) {
  for (int g = 0; g < 8; ++g) {
    for (int l = 0; l < 4; ++l) {
      const int idx = b.qs[4 * g + l] | (((b.qh[g] >> (2 * l)) & 3) << 8);
      PutSigned8(kIq2sGrid[idx], b.qs[32 + 4 * g + l], out->w + 32 * g + 8 * l);
    }
    out->s[2 * g] = b.scales[g] & 0xF;
    out->s[2 * g + 1] = b.scales[g] >> 4;
  }
}

void Decode(const BlockIQ3_XXS& b, IqBlock* out) {
  for (int g = 0; g < 8; ++g) {
    uint32_t sw;
    std::memcpy(&sw, b.qs + 64 + 4 * g, 4);
    for (int l = 0; l < 4; ++l) {
      PutSigned4x2(kIq3xxsGrid[b.qs[8 * g + 2 * l]], kIq3xxsGrid[b.qs[8 * g + 2 * l + 1]],
                   IqSignBits(sw >> (7 * l)), out->w + 32 * g + 8 * l);
    }
    out->s[2 * g] = out->s[2 * g + 1] = static_cast<uint8_t>(sw >> 28);
  }
}

void Decode(const BlockIQ3_S& b, IqBlock* out) {
  for (int g = 0; g < 8; ++g) {
    for (int l = 0; l < 4; ++l) {
      const int i1 = b.qs[8 * g + 2 * l] | (((b.qh[g] >> (2 * l)) & 1) << 8);
      const int i2 = b.qs[8 * g + 2 * l + 1] | (((b.qh[g] >> (2 * l + 1)) & 1) << 8);
      PutSigned4x2(kIq3sGrid[i1], kIq3sGrid[i2], b.signs[4 * g + l], out->w + 32 * g + 8 * l);
    }
    out->s[2 * g] = out->s[2 * g + 1] = (b.scales[g / 2] >> (4 * (g % 2))) & 0xF;
  }
}

// IQ1: w = 8 * grid + (delta < 0 ? -1 : 1).
inline void PutIq1(int idx, bool neg_delta, int8_t* w) {
  const uint64_t g = kIq1Grid8[idx];
  for (int j = 0; j < 8; ++j) {
    w[j] = static_cast<int8_t>(static_cast<int8_t>((g >> (8 * j)) & 0xFF) + (neg_delta ? -1 : 1));
  }
}

void Decode(const BlockIQ1_S& b, IqBlock* out) {
  for (int g = 0; g < 8; ++g) {
    const int qh = b.qh[g];
    for (int l = 0; l < 4; ++l) {
      PutIq1(b.qs[4 * g + l] | (((qh >> (3 * l)) & 7) << 8), (qh & 0x8000) != 0,
             out->w + 32 * g + 8 * l);
    }
    out->s[2 * g] = out->s[2 * g + 1] = static_cast<uint8_t>((qh >> 12) & 7);
  }
}

void Decode(const BlockIQ1_M& b, IqBlock* out) {
  uint16_t sc[4];
  std::memcpy(sc, b.scales, 8);
  for (int g = 0; g < 8; ++g) {
    for (int l = 0; l < 4; ++l) {
      const int nib = (b.qh[2 * g + l / 2] >> (4 * (l % 2))) & 0xF;
      PutIq1(b.qs[4 * g + l] | ((nib & 7) << 8), (nib & 8) != 0, out->w + 32 * g + 8 * l);
    }
    out->s[2 * g] = (sc[g / 2] >> (6 * (g % 2))) & 7;
    out->s[2 * g + 1] = (sc[g / 2] >> (6 * (g % 2) + 3)) & 7;
  }
}

#include "quant/iquants_common.inc"

template <typename B>
void Dequantize(const void* vx, float* y, int64_t k) {
  LAMINA_DCHECK(k % kQK_K == 0);
  const auto* x = static_cast<const B*>(vx);
  IqBlock dec;
  for (int64_t i = 0; i < k / kQK_K; ++i, y += kQK_K) {
    Decode(x[i], &dec);
    const float d = Iq<B>::D(x[i]);
    for (int h = 0; h < 16; ++h) {
      const float db = Iq<B>::Db(d, dec.s[h]);
      for (int j = 16 * h; j < 16 * h + 16; ++j) {
        // IQ1: grid + delta = w / 8, exact.
        y[j] = kIsIq1<B> ? db * (static_cast<float>(dec.w[j]) * 0.125f)
                         : db * static_cast<float>(dec.w[j]);
      }
    }
  }
}

template <typename B>
void VecDot(int64_t k, float* s, const void* vx, const void* vy) {
  const auto* x = static_cast<const B*>(vx);
  const auto* y = static_cast<const BlockQ8_K*>(vy);
  IqBlock dec;
  float sumf = 0;
  for (int64_t i = 0; i < k / kQK_K; ++i) {
    Decode(x[i], &dec);
    int32_t isum = 0;
    for (int h = 0; h < 16; ++h) {
      int32_t part = 0;
      for (int j = 16 * h; j < 16 * h + 16; ++j) part += dec.w[j] * y[i].qs[j];
      isum += (2 * dec.s[h] + 1) * part;
    }
    const float d = Iq<B>::D(x[i]) * y[i].d;
    if constexpr (kIsIq1<B>) {
      sumf += d * (static_cast<float>(isum) * 0.125f);
    } else {
      sumf += d * static_cast<float>(isum);
    }
  }
  *s = Iq<B>::kFinal * sumf;
}

template <typename B>
void VecDotMulti(int64_t k, const void* w_row, const void* act, size_t act_row_bytes, int n_act,
                 float* out) {
  LAMINA_DCHECK(n_act >= 1 && n_act <= kMaxMultiDot);
  const auto* a = static_cast<const uint8_t*>(act);
  for (int j = 0; j < n_act; ++j) VecDot<B>(k, &out[j], w_row, a + j * act_row_bytes);
}

template <typename B>
void Set(KernelTable& table, GgmlType type) {
  TypeKernels& e = table[static_cast<int>(type)];
  e.type = type;
  e.vec_dot_type = GgmlType::kQ8_K;
  e.dequantize = Dequantize<B>;
  e.quantize = nullptr;  // llama-quantize makes these files (with an importance matrix)
  e.vec_dot = VecDot<B>;
  e.vec_dot_multi = VecDotMulti<B>;
}

}  // namespace

void RegisterScalarIQuants(KernelTable& table) {
  Set<BlockIQ2_XXS>(table, GgmlType::kIQ2_XXS);
  Set<BlockIQ2_XS>(table, GgmlType::kIQ2_XS);
  Set<BlockIQ2_S>(table, GgmlType::kIQ2_S);
  Set<BlockIQ3_XXS>(table, GgmlType::kIQ3_XXS);
  Set<BlockIQ3_S>(table, GgmlType::kIQ3_S);
  Set<BlockIQ1_S>(table, GgmlType::kIQ1_S);
  Set<BlockIQ1_M>(table, GgmlType::kIQ1_M);
}

}  // namespace lamina::quant_internal
