// int8 dense layers on AVX2 (no VNNI: AMD Zen 2 and 3, Intel Haswell to Skylake clients): the
// scheme and layouts of dense_int8.h with activation codes 0..127. AVX2 multiplies unsigned
// by signed bytes only in pairs summed to 16 bits with saturation (VPMADDUBSW), then pairs of
// those to 32 bits (VPMADDWD by ones): two products of 127 x 127 make 32,258, inside int16,
// where codes up to 255 would pass it (as PyTorch's x86 int8 reduces its range to 7 bits
// there). Why ours and not oneDNN's int8 matmul: as TensorFlow 2.15 calls it, it reorders the
// weight on every call and quantizes a whole tensor at one scale (finetuning/int8_dense.py).
//
// A block of 2 rows x one panel (32 columns, four registers) keeps its 8 sums in registers
// over the whole depth: per depth quad, four loads of W, two 4-byte broadcasts of the rows'
// codes and 8 x (VPMADDUBSW, VPMADDWD, VPADDD) (13 of the 16 registers). Rows in chunks
// that stay in L2 while the panels pass.
//
// Before including: vectors.h compiled for AVX2, activation.h and dense_int8.h.
#include <immintrin.h>

namespace {

constexpr int kAvx2Int8Rows = 2;
constexpr int64_t kAvx2Int8ChunkBytes = 256 * 1024;  // codes of the rows one pass covers

// `R` rows (an Int8RowsFn).
template <int R>
static void avx2_int8_rows(const uint8_t* codes, const int8_t* panel, int64_t depth_blocks,
                           const Int8Columns& columns, const float* low, const float* step,
                           float* y, int64_t n, int activation) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i sums[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) sums[r][v] = _mm256_setzero_si256();
  for (int64_t kb = 0; kb < depth_blocks; ++kb) {
    const uint8_t* x = codes + kb * kInt8Block * 64;
    const int8_t* w = panel + kb * kInt8Block * 64;
    for (int quad = 0; quad < 16; ++quad) {
      __m256i a[R];
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, x + r * 64 + quad * 4, 4);
        a[r] = _mm256_set1_epi32(four);
      }
      for (int v = 0; v < 4; ++v) {  // columns 8v .. 8v + 7: half v / 2, its 8-column part
        const __m256i weights = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(w + (v / 2) * 1024 + quad * 64 + (v % 2) * 32));
        for (int r = 0; r < R; ++r)
          sums[r][v] = _mm256_add_epi32(
              sums[r][v], _mm256_madd_epi16(_mm256_maddubs_epi16(a[r], weights), ones));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) int32_t row_sums[kInt8Block];
    for (int v = 0; v < 4; ++v)
      _mm256_store_si256(reinterpret_cast<__m256i*>(row_sums + v * 8), sums[r][v]);
    columns.store_row(row_sums, step[r], low[r], y + r * n, activation);
  }
}

constexpr Int8RowsFn kAvx2Int8RowsFns[kAvx2Int8Rows + 1] = {
    nullptr, avx2_int8_rows<1>, avx2_int8_rows<2>};

}  // namespace

// Row blocks [first_block, end_block) of x [rows, k] (float32) into codes 0..levels (this
// op's: 127), laid out as dense_int8.h says, with each row's low and step.
extern "C" void quantize_rows_u8_avx2(const float* x, uint8_t* packed, float* low, float* step,
                                      int64_t rows, int64_t k, int64_t first_block,
                                      int64_t end_block, int levels) {
  quantize_rows(x, packed, low, step, rows, k, first_block, end_block, levels);
}

// Panels [first_panel, end_panel) of y [rows, n] (float32) from x's codes
// (quantize_rows_u8_avx2 with 127 levels).
extern "C" void dense_int8_avx2(const uint8_t* x_packed, const float* low, const float* step,
                                const int8_t* packed, const float* scale,
                                const float* weight_sums, const float* bias, float* y,
                                int64_t rows, int64_t k, int64_t n, int activation,
                                int64_t first_panel, int64_t end_panel) {
  int8_vector_panels(kAvx2Int8RowsFns, kAvx2Int8Rows, kAvx2Int8ChunkBytes, x_packed, low, step,
                     packed, scale, weight_sums, bias, y, rows, k, n, activation, first_panel,
                     end_panel);
}
