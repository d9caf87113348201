// The vector code both kernels share: GCC's generic vectors of the widest width the unit is
// compiled for (one AVX-512 register, one AVX2 one, or an SSE one), loads and stores, bfloat16
// conversions, and exp. No TensorFlow header: a unit compiles in a second or two.
#include <cstdint>
#include <cmath>
#include <algorithm>
#include <cstring>
#include <vector>

// Internal to each unit that includes it: the units differ in kLanes, so nothing of theirs
// may be merged across units by the linker (as template instances otherwise are).
namespace {

// The widest vector the unit is compiled for, and how many accumulators a block keeps
// (kRows x kVectors): as many independent chains as the registers hold (an FMA's result waits
// ~4 cycles, and two issue a cycle), without spilling: AVX-512 16 of its 32 registers, AVX2
// 12 of 16. (Measured on the Xeon of bench/README.md, one thread, 12 heads of 160 rows: AVX2
// 6 rows ~10% faster than 4; AVX-512 12 rows no faster than 8.)
#if defined(__AVX512F__)
constexpr int kLanes = 16, kRows = 8, kVectors = 2;
#elif defined(__AVX2__)
constexpr int kLanes = 8, kRows = 6, kVectors = 2;
#else
constexpr int kLanes = 4, kRows = 4, kVectors = 2;
#endif

typedef float vf __attribute__((vector_size(4 * kLanes)));
typedef int32_t vi __attribute__((vector_size(4 * kLanes)));

static inline vf load(const float* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
static inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
// x - (+0) is x for every x (-0 too), so the compiler folds it to one broadcast; 0 + x is not
// (-0 + 0 is +0), and costs an add before the broadcast.
static inline vf splat(float x) { return x - vf{}; }

static inline float to_float(float x) { return x; }
static inline float to_float(uint16_t bf16) {
  uint32_t bits = static_cast<uint32_t>(bf16) << 16;
  float x; std::memcpy(&x, &bits, sizeof x); return x;
}
static inline void from_float(float x, float* out) { *out = x; }
static inline void from_float(float x, uint16_t* out) {  // to nearest even, as TensorFlow rounds
  uint32_t bits; std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) { *out = static_cast<uint16_t>((bits >> 16) | 0x40); return; }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  *out = static_cast<uint16_t>(bits >> 16);
}

// exp(x) for x <= 0, to float32's rounding (Cody-Waite reduction, Cephes' polynomial);
// exactly 0 below -87, where float32's exp underflows anyway.
static inline vf exp_nonpositive(vf x) {
  const vf magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  vf clamped = x < splat(-87.0f) ? splat(-87.0f) : x;
  vf t = clamped * 1.44269504088896341f + magic;
  vf n = t - magic;
  vf r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
  vf p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  vf y = p * (r * r) + r + 1.0f;
  vi exponent = ((vi)t - (vi)magic + 127) << 23;
  y = y * (vf)exponent;
  return x < splat(-87.0f) ? splat(0.0f) : y;
}

// The next of `parts` near-equal parts of `remaining` rows: a kernel's groups of rows kept in
// registers, 25 rows as 9 + 8 + 8 and not 12 + 12 + 1, whose lone row waits on its sums'
// latency (8-13% of a short call's product, one thread, Zen 4: bench/README.md).
static inline int64_t even_share(int64_t remaining, int64_t parts) {
  return (remaining + parts - 1) / parts;
}

// A vector's lanes reduced pairwise: log2(lanes) dependent steps, not lanes - 1 (a row's
// softmax and layer norm each wait on two of these).
static inline float lane_max(vf v) {
  float t[kLanes];
  std::memcpy(t, &v, sizeof v);
  for (int n = kLanes / 2; n > 0; n /= 2)
    for (int i = 0; i < n; ++i) t[i] = t[i + n] > t[i] ? t[i + n] : t[i];
  return t[0];
}
static inline float lane_sum(vf v) {
  float t[kLanes];
  std::memcpy(t, &v, sizeof v);
  for (int n = kLanes / 2; n > 0; n /= 2)
    for (int i = 0; i < n; ++i) t[i] += t[i + n];
  return t[0];
}

}  // namespace
