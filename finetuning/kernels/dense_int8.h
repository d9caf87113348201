// The int8 dense layers' scheme, shared by AMX-INT8 (dense_amx.h) and AVX-512 VNNI
// (dense_vnni.h): float32 in and out, y = activation(x · W + bias) with each row of x
// quantized on the fly, asymmetric, to codes 0..255 (x ≈ low[r] + step[r] · code), and W
// quantized once per column, symmetric (W[:, c] ≈ scale[c] · Wq[:, c], Wq in -127..127):
//   x · W ≈ step[r] · scale[c] · (codes · Wq)[r, c] + low[r] · weight_sums[c]
// with weight_sums[c] = scale[c] · sum_k Wq[k, c] (finetuning/packed_dense.py makes it).
// Both instruction sets multiply unsigned 8-bit codes by signed 8-bit weights four at a
// time into 32-bit sums (TDPBUSD, VPDPBUSD), so one layout serves both:
//   W [n / 32][k / 64][2][16][16][4]: panel, depth block of 64, column half, depth quad i,
//     column, the quad's four depths 4i .. 4i + 3 (one 1 KB AMX B tile per (p, kb, h); to
//     VNNI, 16 registers of one quad's 16 columns each);
//   x's codes [ceil(rows / 32)][k / 64][32][64]: row block, depth block, row, depth (two
//     1 KB AMX A tiles per (row block, depth block); to VNNI, a row's quad is 4 bytes to
//     broadcast).
// k a multiple of 64, n of 32.
//
// Before including: vectors.h compiled for AVX-512 and activation.h.
#pragma once
#include <immintrin.h>

namespace {

constexpr int kInt8Block = 32;  // rows of a block of codes, columns of a panel

// One panel's per-column terms, loaded once, and the float32 outputs of a row from its 32
// sums.
struct Int8Columns {
  vf scale0, scale1, sums0, sums1, bias0, bias1;
  Int8Columns(const float* scale, const float* weight_sums, const float* bias, int64_t panel)
      : scale0(load(scale + panel * 32)), scale1(load(scale + panel * 32 + 16)),
        sums0(load(weight_sums + panel * 32)), sums1(load(weight_sums + panel * 32 + 16)),
        bias0(load(bias + panel * 32)), bias1(load(bias + panel * 32 + 16)) {}

  void store_row(__m512i low_sums, __m512i high_sums, float step, float low, float* out,
                 int activation) const {
    const vf unit = splat(step), offset = splat(low);
    const vf i0 = (vf)_mm512_cvtepi32_ps(low_sums), i1 = (vf)_mm512_cvtepi32_ps(high_sums);
    store(out, activate(i0 * unit * scale0 + offset * sums0 + bias0, activation));
    store(out + 16, activate(i1 * unit * scale1 + offset * sums1 + bias1, activation));
  }
};

}  // namespace
