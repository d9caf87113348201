// The int8 dense layers' scheme, shared by AMX-INT8 (dense_amx.h), AVX-512 VNNI
// (dense_vnni.h) and AVX2 (dense_int8_avx2.h): float32 in and out, y = activation(x · W +
// bias) with each row of x quantized on the fly, asymmetric, to codes 0..levels (x ≈ low[r]
// + step[r] · code; levels 255, or 127 for AVX2, whose pairs of products are summed in 16
// bits first), and W quantized once per column, symmetric (W[:, c] ≈ scale[c] · Wq[:, c], Wq
// in -127..127):
//   x · W ≈ step[r] · scale[c] · (codes · Wq)[r, c] + low[r] · weight_sums[c]
// with weight_sums[c] = scale[c] · sum_k Wq[k, c] (finetuning/packed_dense.py makes it).
// Each instruction set multiplies unsigned 8-bit codes by signed 8-bit weights four at a
// time into 32-bit sums (TDPBUSD, VPDPBUSD; AVX2's VPMADDUBSW and VPMADDWD), so one layout
// serves all three:
//   W [n / 32][k / 64][2][16][16][4]: panel, depth block of 64, column half, depth quad i,
//     column, the quad's four depths 4i .. 4i + 3 (one 1 KB AMX B tile per (p, kb, h); to
//     the vector codes, one quad's 16 columns are 64 bytes: one AVX-512 register, two AVX2);
//   x's codes [ceil(rows / 32)][k / 64][32][64]: row block, depth block, row, depth (two
//     1 KB AMX A tiles per (row block, depth block); to the vector codes, a row's quad is 4
//     bytes to broadcast).
// k a multiple of 64, n of 32.
//
// Before including: vectors.h (its widest vectors: AVX-512 or AVX2) and activation.h.
#pragma once
#include <immintrin.h>

namespace {

constexpr int kInt8Block = 32;  // rows of a block of codes, columns of a panel
constexpr int kPanelVectors = kInt8Block / kLanes;

// One panel's per-column terms, loaded once, and the float32 outputs of a row from its 32
// integer sums.
struct Int8Columns {
  vf scale[kPanelVectors], sums[kPanelVectors], bias[kPanelVectors];
  Int8Columns(const float* scales, const float* weight_sums, const float* biases,
              int64_t panel) {
    for (int v = 0; v < kPanelVectors; ++v) {
      scale[v] = load(scales + panel * kInt8Block + v * kLanes);
      sums[v] = load(weight_sums + panel * kInt8Block + v * kLanes);
      bias[v] = load(biases + panel * kInt8Block + v * kLanes);
    }
  }

  // `integer`: the row's 32 sums of codes · Wq, in column order.
  void store_row(const int32_t* integer, float step, float low, float* out,
                 int activation) const {
    const vf unit = splat(step), offset = splat(low);
    for (int v = 0; v < kPanelVectors; ++v) {
      vi whole;
      std::memcpy(&whole, integer + v * kLanes, sizeof whole);
      const vf sum = __builtin_convertvector(whole, vf);
      store(out + v * kLanes, activate(sum * unit * scale[v] + offset * sums[v] + bias[v],
                                       activation));
    }
  }
};

// A vector code's block of rows in registers: `count` (its template) rows of codes (from a row
// block's row, at depth block 0) against one panel over `depth_blocks` blocks of 64, the
// outputs stored from `y` (row stride n).
typedef void (*Int8RowsFn)(const uint8_t* codes, const int8_t* panel, int64_t depth_blocks,
                           const Int8Columns& columns, const float* low, const float* step,
                           float* y, int64_t n, int activation);

// Panels [first_panel, end_panel) of y [rows, n] (float32) from x's codes, for the vector codes
// (VNNI, AVX2): rows in chunks of `chunk_bytes` of codes, which stay in L2 while the panels
// pass; each row block in near-equal groups of up to `group` rows (`even_share`),
// `rows_fns[count]` computing count.
static inline void int8_vector_panels(const Int8RowsFn* rows_fns, int group, int64_t chunk_bytes,
                                      const uint8_t* x_packed, const float* low,
                                      const float* step, const int8_t* packed,
                                      const float* scale, const float* weight_sums,
                                      const float* bias, float* y, int64_t rows, int64_t k,
                                      int64_t n, int activation, int64_t first_panel,
                                      int64_t end_panel) {
  const int64_t blocks = (rows + kInt8Block - 1) / kInt8Block;
  const int64_t block_bytes = k * kInt8Block;  // of packed codes
  const int64_t chunk = std::max<int64_t>(1, chunk_bytes / block_bytes);
  for (int64_t first = 0; first < blocks; first += chunk) {
    const int64_t last = std::min(blocks, first + chunk);
    for (int64_t p = first_panel; p < end_panel; ++p) {
      const int8_t* panel = packed + p * k * kInt8Block;
      const Int8Columns columns(scale, weight_sums, bias, p);
      for (int64_t block = first; block < last; ++block) {
        const int64_t valid = std::min<int64_t>(kInt8Block, rows - block * kInt8Block);
        const int64_t groups = (valid + group - 1) / group;
        for (int64_t g = 0, r = 0; g < groups; ++g) {
          const int64_t row = block * kInt8Block + r, count = even_share(valid - r, groups - g);
          rows_fns[count](x_packed + block * block_bytes + r * 64, panel, k / 64, columns,
                          low + row, step + row, y + row * n + p * kInt8Block, n, activation);
          r += count;
        }
      }
    }
  }
}

// One vector of codes (whole numbers 0..255 as int32) stored as kLanes bytes. (GCC's own
// conversion of the generic vectors took each lane out on its own under AVX2: 4x slower.)
static inline void store_codes(uint8_t* out, vi whole) {
#if defined(__AVX512F__)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8((__m512i)whole));
#else
  const __m256i lanes = (__m256i)whole;
  const __m128i pairs = _mm_packus_epi32(_mm256_castsi256_si128(lanes),
                                         _mm256_extracti128_si256(lanes, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm_packus_epi16(pairs, pairs));
#endif
}

// Row blocks [first_block, end_block) of x [rows, k] (float32) into codes 0..levels, laid
// out as above, with each row's low and step.
static inline void quantize_rows(const float* x, uint8_t* packed, float* low, float* step,
                                 int64_t rows, int64_t k, int64_t first_block,
                                 int64_t end_block, int levels) {
  for (int64_t block = first_block; block < end_block; ++block)
    for (int r = 0; r < kInt8Block; ++r) {
      const int64_t row = block * kInt8Block + r;
      uint8_t* codes = packed + block * k * kInt8Block + r * 64;  // depth block 0's row
      if (row >= rows) {
        for (int64_t kb = 0; kb < k / 64; ++kb) std::memset(codes + kb * kInt8Block * 64, 0, 64);
        continue;
      }
      const float* values = x + row * k;
      vf lowest = load(values), highest = lowest;
      for (int64_t i = kLanes; i < k; i += kLanes) {
        const vf v = load(values + i);
        lowest = v < lowest ? v : lowest;
        highest = v > highest ? v : highest;
      }
      const float lo = -lane_max(-lowest), hi = lane_max(highest);
      const float unit = hi > lo ? (hi - lo) / static_cast<float>(levels) : 1.0f;
      low[row] = lo;
      step[row] = unit;
      const vf inverse = splat(1.0f / unit), offset = splat(lo), top = splat(levels);
      for (int64_t kb = 0; kb < k / 64; ++kb)
        for (int i = 0; i < 64; i += kLanes) {
          vf scaled = (load(values + kb * 64 + i) - offset) * inverse + 0.5f;
          scaled = scaled < vf{} ? vf{} : (scaled > top ? top : scaled);
          store_codes(codes + kb * kInt8Block * 64 + i, __builtin_convertvector(scaled, vi));
        }
    }
}

}  // namespace
