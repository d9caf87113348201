// bfloat16 dense layers on AVX512_BF16 (VDPBF16PS: 16 float32 lanes, each adding the two
// products of a pair of bfloat16s), for CPUs with native bfloat16 and no AMX (AMD Zen 4 and 5,
// Intel Cooper Lake): y = activation(x · W + bias), x and y bfloat16, W bfloat16 packed once
// at load, sums and bias in float32, one rounding to bfloat16 at the end, as dense_amx.h.
//
// Why our own, where oneDNN's bfloat16 inner product already runs near the instruction's rate
// (unlike its AMX code): on a Zen 4, paired in one process, a served 170-token SQuAD request
// 1.08x faster with this op, level from batch 8, 0.95x for short SST-2 sentences at batch 1
// (bench/README.md); one thread alone runs at 80-90% of VDPBF16PS's rate, 1.9x our float32
// kernel. It also takes the GELU into its epilogue, as AMX's op does.
//
// W is in AMX's layout (dense_amx.h: panel, depth block of 32, column half, depth pair,
// column, the pair's two depths), which is what a vector code wants too: one pair of 16
// columns is 64 bytes, one register. x is read where it is (row-major, no copy): a row's pair
// of depths is 4 bytes to broadcast. A block of up to kDpbf16Rows rows x one panel (32
// columns, two registers) keeps its sums in registers over the whole depth; rows in chunks
// that stay in L2 while the panels pass.
//
// Before including: vectors.h compiled for AVX-512 and activation.h; the unit compiled with
// AVX512-BF16.
#include <immintrin.h>

namespace {

constexpr int kDpbf16Rows = 12;  // rows a block keeps in registers (24 of the 32)
constexpr int64_t kDpbf16ChunkBytes = 512 * 1024;  // of x's rows that one pass covers

// `R` rows of x (row stride k) against one panel: y's R rows of the panel's 32 columns.
template <int R>
static void dpbf16_rows(const uint16_t* x, int64_t k, const uint16_t* panel, vf bias_low,
                        vf bias_high, uint16_t* y, int64_t n, int activation) {
  __m512 sums[R][2];
  for (int r = 0; r < R; ++r) sums[r][0] = sums[r][1] = _mm512_setzero_ps();
  for (int64_t kb = 0; kb < k / 32; ++kb) {
    const uint16_t* w = panel + kb * 1024;  // two 1 KB halves of 16 pairs x 16 columns
    const uint16_t* depths = x + kb * 32;
    for (int pair = 0; pair < 16; ++pair) {
      const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + pair * 32);
      const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + 512 + pair * 32);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        int32_t two;
        std::memcpy(&two, depths + r * k + pair * 2, 4);
        const __m512bh a = (__m512bh)_mm512_set1_epi32(two);
        sums[r][0] = _mm512_dpbf16_ps(sums[r][0], a, w0);
        sums[r][1] = _mm512_dpbf16_ps(sums[r][1], a, w1);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const vf low = activate((vf)sums[r][0] + bias_low, activation);
    const vf high = activate((vf)sums[r][1] + bias_high, activation);
    const __m512bh both = _mm512_cvtne2ps_pbh((__m512)high, (__m512)low);
    _mm512_storeu_si512(y + r * n, (__m512i)both);
  }
}

typedef void (*Dpbf16RowsFn)(const uint16_t*, int64_t, const uint16_t*, vf, vf, uint16_t*,
                             int64_t, int);

constexpr Dpbf16RowsFn kDpbf16RowsFns[kDpbf16Rows + 1] = {
    nullptr, dpbf16_rows<1>, dpbf16_rows<2>, dpbf16_rows<3>, dpbf16_rows<4>,
    dpbf16_rows<5>, dpbf16_rows<6>, dpbf16_rows<7>, dpbf16_rows<8>,
    dpbf16_rows<9>, dpbf16_rows<10>, dpbf16_rows<11>, dpbf16_rows<12>};

}  // namespace

// Panels [first_panel, end_panel) of y [rows, n] = activation(x · W + bias), x [rows, k]
// bfloat16 row-major, W packed as dense_amx.h's; k and n multiples of 32.
extern "C" void dense_bf16_dpbf16(const uint16_t* x, const uint16_t* packed, const float* bias,
                                  uint16_t* y, int64_t rows, int64_t k, int64_t n,
                                  int activation, int64_t first_panel, int64_t end_panel) {
  const int64_t chunk = std::max<int64_t>(kDpbf16Rows, kDpbf16ChunkBytes / (2 * k));
  for (int64_t first = 0; first < rows; first += chunk) {
    const int64_t last = std::min(rows, first + chunk);
    const int64_t groups = (last - first + kDpbf16Rows - 1) / kDpbf16Rows;
    for (int64_t p = first_panel; p < end_panel; ++p) {
      const uint16_t* panel = packed + p * k * 32;
      const vf b0 = load(bias + p * 32), b1 = load(bias + p * 32 + 16);
      for (int64_t g = 0, row = first; g < groups; ++g) {
        const int64_t count = even_share(last - row, groups - g);
        kDpbf16RowsFns[count](x + row * k, k, panel, b0, b1, y + row * n + p * 32, n,
                              activation);
        row += count;
      }
    }
  }
}
