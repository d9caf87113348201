// int8 dense layers on AVX-512 VNNI (VPDPBUSD: 16 lanes, each the 32-bit sum of four unsigned
// 8-bit x signed 8-bit products): the scheme and layouts of dense_int8.h, for CPUs with VNNI
// and no AMX (AMD Zen 4 and 5, Intel Cascade Lake to Ice Lake), where oneDNN's int8 matmul,
// as TensorFlow 2.15 calls it, reorders the weight on every call and scales a whole tensor
// at once (finetuning/int8_dense.py).
//
// A block of up to 8 rows x one panel (32 columns, two registers) keeps its 16 sums in
// registers over the whole depth: per depth quad, two loads of W and a 4-byte broadcast of
// each row's codes feed 16 VPDPBUSD. Rows in chunks that stay in L2 while the panels pass,
// as dense_amx.h.
//
// Before including: vectors.h compiled for AVX-512, activation.h and dense_int8.h; the unit
// compiled with AVX512-VNNI.
#include <immintrin.h>

namespace {

constexpr int kVnniRows = 8;  // rows a block keeps in registers (16 of the 32)
constexpr int64_t kInt8ChunkBytes = 512 * 1024;  // codes of the rows one pass covers

// `R` rows (an Int8RowsFn).
template <int R>
static void vnni_rows(const uint8_t* codes, const int8_t* panel, int64_t depth_blocks,
                      const Int8Columns& columns, const float* low, const float* step,
                      float* y, int64_t n, int activation) {
  __m512i sums[R][2];
  for (int r = 0; r < R; ++r) sums[r][0] = sums[r][1] = _mm512_setzero_si512();
  for (int64_t kb = 0; kb < depth_blocks; ++kb) {
    const uint8_t* x = codes + kb * kInt8Block * 64;
    const int8_t* w = panel + kb * kInt8Block * 64;
    for (int quad = 0; quad < 16; ++quad) {
      const __m512i w0 = _mm512_loadu_si512(w + quad * 64);
      const __m512i w1 = _mm512_loadu_si512(w + 1024 + quad * 64);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, x + r * 64 + quad * 4, 4);
        const __m512i a = _mm512_set1_epi32(four);
        sums[r][0] = _mm512_dpbusd_epi32(sums[r][0], a, w0);
        sums[r][1] = _mm512_dpbusd_epi32(sums[r][1], a, w1);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(64) int32_t row_sums[kInt8Block];
    _mm512_store_si512(row_sums, sums[r][0]);
    _mm512_store_si512(row_sums + 16, sums[r][1]);
    columns.store_row(row_sums, step[r], low[r], y + r * n, activation);
  }
}

constexpr Int8RowsFn kVnniRowsFns[kVnniRows + 1] = {
    nullptr, vnni_rows<1>, vnni_rows<2>, vnni_rows<3>, vnni_rows<4>,
    vnni_rows<5>, vnni_rows<6>, vnni_rows<7>, vnni_rows<8>};

}  // namespace

// Row blocks [first_block, end_block) of x [rows, k] (float32) into codes 0..levels, laid out
// as dense_int8.h says, with each row's low and step (AMX's op and this one: 255).
extern "C" void quantize_rows_u8(const float* x, uint8_t* packed, float* low, float* step,
                                 int64_t rows, int64_t k, int64_t first_block,
                                 int64_t end_block, int levels) {
  quantize_rows(x, packed, low, step, rows, k, first_block, end_block, levels);
}

// Panels [first_panel, end_panel) of y [rows, n] (float32) from x's codes (quantize_rows_u8).
extern "C" void dense_int8_vnni(const uint8_t* x_packed, const float* low, const float* step,
                                const int8_t* packed, const float* scale,
                                const float* weight_sums, const float* bias, float* y,
                                int64_t rows, int64_t k, int64_t n, int activation,
                                int64_t first_panel, int64_t end_panel) {
  int8_vector_panels(kVnniRowsFns, kVnniRows, kInt8ChunkBytes, x_packed, low, step, packed,
                     scale, weight_sums, bias, y, rows, k, n, activation, first_panel, end_panel);
}
