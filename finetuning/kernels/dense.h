// A dense layer on float32 rows, y = activation(x · W + bias), with W packed once at load.
//
// Why our own: a served request is a few hundred rows (the real tokens of one to eight
// sequences), where the library's inner product spends much of its time outside the
// multiply-adds; here each block of rows keeps its accumulators in registers over a depth
// block of W (192 of its rows), reads W's columns in the order they are stored, and adds the
// bias and GELU before the block is stored (one pass over y, not three).
//
// Layout: W [k, n] is packed in panels of kDensePanel columns; panel p holds W[:, p*32 ...
// p*32 + 31] as k consecutive rows of 32 floats (finetuning/packed_dense.py packs it).
// n is a multiple of kDensePanel. The caller splits the panels among threads.
//
// Before including: vectors.h, and DENSE_NAME defined to the function's name for the unit.
#include "activation.h"

namespace {

constexpr int kDensePanel = 32;
// Rows a block keeps (kDenseRows x kDenseVectors accumulators, two column vectors and one
// broadcast in registers): AVX-512 24 of its 32 registers, AVX2 12 of 16, SSE 8 of 16.
// (AVX-512 6 rows x 4 vectors, two panels a block, 10 loads to 24 multiply-adds instead of
// 14, measured 4-7% slower on one thread of the Xeon of bench/README.md.)
#if defined(__AVX512F__)
constexpr int kDenseRows = 12;
#elif defined(__AVX2__)
constexpr int kDenseRows = 6;
#else
constexpr int kDenseRows = 4;
#endif
constexpr int kDenseVectors = 2;
constexpr int kDenseWidth = kDenseVectors * kLanes;  // columns one block computes
// Floats of x a chunk of rows holds at most (192 KB: in L2 beside a panel on every x86 CPU
// of the last decade; 512 KB and 1 MB measured no faster on the Xeon of bench/README.md).
constexpr int64_t kDenseChunkFloats = 49152;
// Depths a pass over the panels covers: the 24 KB of a panel's columns a block reads stay in
// L1 while the chunk's row blocks pass: 192 rows of AVX-512's 32 columns, 384 of AVX2's 16
// (both divide BERT's 768, 1024, 3072 and 384, 1536). On the Xeon of bench/README.md AVX2
// code ran ~10% faster with 192 than over all of k (96 KB), AVX-512 the same; on a Zen 4 AVX2
// code ran 2-5% faster with 384 than with 192 at 170-400 rows, 13% at 40.
constexpr int64_t kDenseDepth = 24576 / (kDenseWidth * sizeof(float));

// One block: rows [0, R) of x (row stride k) against kDenseWidth columns of a panel, over
// depths [k_begin, k_end): the sums start from zero on the first depth block (else from y),
// and on the last the bias is added and the activation applied; then stored to y (row
// stride n).
template <int R>
static inline void dense_block(const float* x, const float* panel, const float* bias, float* y,
                               int64_t k, int64_t k_begin, int64_t k_end, int64_t n,
                               int activation) {
  vf acc[R][kDenseVectors];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kDenseVectors; ++v)
      acc[r][v] = k_begin == 0 ? splat(0.0f) : load(y + r * n + v * kLanes);
  for (int64_t kk = k_begin; kk < k_end; ++kk) {
    const float* w = panel + kk * kDensePanel;
    vf w0 = load(w), w1 = load(w + kLanes);
    for (int r = 0; r < R; ++r) {
      vf a = splat(x[r * k + kk]);
      acc[r][0] += a * w0;
      acc[r][1] += a * w1;
    }
  }
  if (k_end == k) {
    vf b0 = load(bias), b1 = load(bias + kLanes);
    for (int r = 0; r < R; ++r) {
      acc[r][0] = activate(acc[r][0] + b0, activation);
      acc[r][1] = activate(acc[r][1] + b1, activation);
    }
  }
  for (int r = 0; r < R; ++r) {
    store(y + r * n, acc[r][0]);
    store(y + r * n + kLanes, acc[r][1]);
  }
}

template <int R>
static inline void dense_tail(int rows, const float* x, const float* panel, const float* bias,
                              float* y, int64_t k, int64_t k_begin, int64_t k_end, int64_t n,
                              int activation) {
  if constexpr (R > 0) {
    if (rows == R) return dense_block<R>(x, panel, bias, y, k, k_begin, k_end, n, activation);
    dense_tail<R - 1>(rows, x, panel, bias, y, k, k_begin, k_end, n, activation);
  }
}

}  // namespace

// Panels [first_panel, end_panel) of y [rows, n] = activation(x [rows, k] · W + bias).
// Rows go in chunks of at most ~192 KB of x's depth block, each chunk against every panel,
// so that a chunk stays in L2 while the panels pass (thousands of rows, batch 8 and up, would
// otherwise bring all of x from L3 once for each panel).
extern "C" void DENSE_NAME(const float* x, const float* packed, const float* bias, float* y,
                           int64_t rows, int64_t k, int64_t n, int activation,
                           int64_t first_panel, int64_t end_panel) {
  const int64_t depth = std::min(k, kDenseDepth);  // of each row a pass reads
  const int64_t chunk = std::max<int64_t>(1, kDenseChunkFloats / (depth * kDenseRows)) * kDenseRows;
  for (int64_t k_begin = 0; k_begin < k; k_begin += kDenseDepth) {
    const int64_t k_end = std::min(k, k_begin + kDenseDepth);
    for (int64_t chunk_start = 0; chunk_start < rows; chunk_start += chunk) {
      const int64_t chunk_end = std::min(rows, chunk_start + chunk);
      for (int64_t p = first_panel; p < end_panel; ++p) {
        const float* panel = packed + p * k * kDensePanel;
        for (int c = 0; c < kDensePanel; c += kDenseWidth) {
          const int64_t column = p * kDensePanel + c;
          int64_t r = chunk_start;
          for (; r + kDenseRows <= chunk_end; r += kDenseRows)
            dense_block<kDenseRows>(x + r * k, panel + c, bias + column, y + r * n + column, k,
                                    k_begin, k_end, n, activation);
          if (r < chunk_end)
            dense_tail<kDenseRows - 1>(static_cast<int>(chunk_end - r), x + r * k, panel + c,
                                       bias + column, y + r * n + column, k, k_begin, k_end, n,
                                       activation);
        }
      }
    }
  }
}
#undef DENSE_NAME
