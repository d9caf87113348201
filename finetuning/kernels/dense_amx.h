// Dense layers on AMX's tiles, y = activation(x · W + bias): in bfloat16 (x and y bfloat16,
// W bfloat16 packed once at load, sums and bias in float32; TDPBF16PS) and in int8 (float32
// in and out, x quantized row by row on every call, W per column once; TDPBUSD, below).
//
// Why our own: a served request is a few hundred rows, and there oneDNN's AMX inner product
// (as TensorFlow 2.15 calls it: bf16 rows in, the weight reordered once and cached) ran a
// 170-row 384 -> 1536 layer with GELU at ~260 GFLOP/s on the Xeon of bench/README.md, where
// one core's tile multiply-adds alone run at ~2,500. Most of the gap is how tiles are loaded:
// a tile read as 16 rows of a row-major matrix (stride k) costs about three times one read
// from 1 KB in a row (measured: a 32 x 32 block over k = 384, 1.6 us against 0.48 us, all
// in L1). So both operands are laid out tile by tile: W once, here at load
// (finetuning/packed_dense.py), x on every call (`pack_rows_bf16`, a copy of the rows).
//
// Layouts (bfloat16 as uint16_t):
//   W packed: [n / 32][k / 32][2][16][16][2]: panel p (columns p*32 ...), depth block kb,
//     half h (columns h*16 ...), depth pair i, column c, then the two depths 2i, 2i + 1 of
//     that column (the pairs AMX's TDPBF16PS multiplies): one 1 KB B tile per (p, kb, h).
//   x packed: [ceil(rows / 32)][k / 32][32][32]: row block, depth block, row, depth: two
//     1 KB A tiles (rows 0-15, 16-31) per (row block, depth block); rows past the last zero.
// k and n are multiples of 32.
//
// Before including: vectors.h compiled for AVX-512 (the epilogue's vectors), activation.h and
// dense_int8.h, and the unit compiled with AMX-TILE, AMX-BF16, AMX-INT8 and AVX512-BF16.
#include <immintrin.h>
#include <unistd.h>
#include <sys/syscall.h>

namespace {

constexpr int kAmxBlock = 32;  // rows and columns of one block (2 x 2 tiles of 16 x 16)
// Rows of x one pass over the panels covers: its packed copy (64 KB per 32 rows at k =
// 1,024) stays in L2 while the panels pass.
constexpr int64_t kAmxChunkBytes = 512 * 1024;

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: the block's float32 sums (rows 0-15 | 16-31) x (columns 0-15 | 16-31);
// 4, 5: x's rows 0-15 and 16-31 over 32 depths; 6, 7: W's two column halves over them.
static inline void configure_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) { config.rows[t] = 16; config.bytes_per_row[t] = 64; }
  _tile_loadconfig(&config);
}

// The 32 x 32 sums of one row block of packed x against one panel, over `steps` depth
// blocks of 2 KB each side (two 1 KB tiles): float32 of bfloat16 pairs (TDPBF16PS) or, with
// kInt8, int32 of unsigned x signed byte quads (TDPBUSD). Stored to `sums` (32 x 32, 4 bytes
// each).
template <bool kInt8>
static inline void amx_block(const void* x_block, const void* panel, void* sums,
                             int64_t steps) {
  const char* x_bytes = static_cast<const char*>(x_block);
  const char* w_bytes = static_cast<const char*>(panel);
  char* out = static_cast<char*>(sums);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int64_t step = 0; step < steps; ++step) {
    _tile_loadd(4, x_bytes + step * 2048, 64);
    _tile_loadd(5, x_bytes + step * 2048 + 1024, 64);
    _tile_loadd(6, w_bytes + step * 2048, 64);
    _tile_loadd(7, w_bytes + step * 2048 + 1024, 64);
    if constexpr (kInt8) {
      _tile_dpbusd(0, 4, 6);
      _tile_dpbusd(1, 4, 7);
      _tile_dpbusd(2, 5, 6);
      _tile_dpbusd(3, 5, 7);
    } else {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, out, 128);
  _tile_stored(1, out + 64, 128);
  _tile_stored(2, out + 16 * 128, 128);
  _tile_stored(3, out + 16 * 128 + 64, 128);
}

}  // namespace

// Whether this process may use AMX's tile registers (Linux asks each process to request
// them: arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA; granted where the CPU and kernel
// have them). 1 or 0.
extern "C" int amx_request_tiles() {
  constexpr long kArchRequestPermission = 0x1023, kTileData = 18;
  return syscall(SYS_arch_prctl, kArchRequestPermission, kTileData) == 0 ? 1 : 0;
}

// Row blocks [first_block, end_block) of x [rows, k] (bfloat16, row-major) into the packed
// layout above.
extern "C" void pack_rows_bf16(const uint16_t* x, uint16_t* packed, int64_t rows, int64_t k,
                               int64_t first_block, int64_t end_block) {
  for (int64_t block = first_block; block < end_block; ++block)
    for (int64_t kb = 0; kb < k / 32; ++kb) {
      uint16_t* tile = packed + (block * (k / 32) + kb) * 1024;
      for (int r = 0; r < kAmxBlock; ++r) {
        const int64_t row = block * kAmxBlock + r;
        if (row < rows) std::memcpy(tile + r * 32, x + row * k + kb * 32, 64);
        else std::memset(tile + r * 32, 0, 64);
      }
    }
}

// Panels [first_panel, end_panel) of y [rows, n] = activation(x · W + bias), x packed.
extern "C" void dense_bf16_amx(const uint16_t* x_packed, const uint16_t* packed,
                               const float* bias, uint16_t* y, int64_t rows, int64_t k,
                               int64_t n, int activation, int64_t first_panel,
                               int64_t end_panel) {
  configure_tiles();
  alignas(64) float sums[kAmxBlock * kAmxBlock];
  const int64_t blocks = (rows + kAmxBlock - 1) / kAmxBlock;
  const int64_t block_elements = k / 32 * 1024;  // of packed x
  const int64_t chunk = std::max<int64_t>(1, kAmxChunkBytes / (2 * block_elements));
  for (int64_t first = 0; first < blocks; first += chunk) {
    const int64_t last = std::min(blocks, first + chunk);
    for (int64_t p = first_panel; p < end_panel; ++p) {
      const uint16_t* panel = packed + p * k * 32;
      const vf b0 = load(bias + p * 32), b1 = load(bias + p * 32 + 16);
      for (int64_t block = first; block < last; ++block) {
        amx_block<false>(x_packed + block * block_elements, panel, sums, k / 32);
        const int64_t valid = std::min<int64_t>(kAmxBlock, rows - block * kAmxBlock);
        for (int64_t r = 0; r < valid; ++r) {
          const vf low = activate(load(sums + r * 32) + b0, activation);
          const vf high = activate(load(sums + r * 32 + 16) + b1, activation);
          const __m512bh both = _mm512_cvtne2ps_pbh((__m512)high, (__m512)low);
          _mm512_storeu_si512(y + (block * kAmxBlock + r) * n + p * 32, (__m512i)both);
        }
      }
    }
  }
  _tile_release();
}

// int8 on AMX-INT8 (TDPBUSD: unsigned 8-bit x signed 8-bit, 32-bit sums): the scheme and both
// operands' layouts are dense_int8.h's; x's codes come from quantize_rows_u8 (dense_vnni.h).

// Panels [first_panel, end_panel) of y [rows, n] (float32) from x's codes (quantize_rows_u8).
extern "C" void dense_int8_amx(const uint8_t* x_packed, const float* low, const float* step,
                               const int8_t* packed, const float* scale,
                               const float* weight_sums, const float* bias, float* y,
                               int64_t rows, int64_t k, int64_t n, int activation,
                               int64_t first_panel, int64_t end_panel) {
  configure_tiles();
  alignas(64) int32_t sums[kAmxBlock * kAmxBlock];
  const int64_t blocks = (rows + kAmxBlock - 1) / kAmxBlock;
  const int64_t block_bytes = k * kAmxBlock;  // of packed codes
  const int64_t chunk = std::max<int64_t>(1, kAmxChunkBytes / block_bytes);
  for (int64_t first = 0; first < blocks; first += chunk) {
    const int64_t last = std::min(blocks, first + chunk);
    for (int64_t p = first_panel; p < end_panel; ++p) {
      const int8_t* panel = packed + p * k * 32;
      const Int8Columns columns(scale, weight_sums, bias, p);
      for (int64_t block = first; block < last; ++block) {
        amx_block<true>(x_packed + block * block_bytes, panel, sums, k / 64);
        const int64_t valid = std::min<int64_t>(kAmxBlock, rows - block * kAmxBlock);
        for (int64_t r = 0; r < valid; ++r) {
          const int64_t row = block * kAmxBlock + r;
          columns.store_row(sums + r * 32, step[row], low[row], y + row * n + p * 32,
                            activation);
        }
      }
    }
  }
  _tile_release();
}

