// The dense layers' activations on float32 vectors (dense.h, dense_amx.h): linear, or the
// exact GELU, 0.5·x·(1 + erf(x/√2)). Before including: vectors.h.
#pragma once

namespace {

// erf(x) as x·P(x²)/Q(x²) on [-4, 4] (erf is ±1 in float32 beyond), a rational
// approximation near float32's rounding (tests/test_packed_dense.py holds the GELU to
// TensorFlow's own float32 error against float64).
static inline vf erf_rational(vf x) {
  vf c = x < splat(-4.0f) ? splat(-4.0f) : (x > splat(4.0f) ? splat(4.0f) : x);
  vf c2 = c * c;
  vf p = splat(-2.72614225801306e-10f);
  p = p * c2 + 2.77068142495902e-08f;
  p = p * c2 + -2.10102402082508e-06f;
  p = p * c2 + -5.69250639462346e-05f;
  p = p * c2 + -7.34990630326855e-04f;
  p = p * c2 + -2.95459980854025e-03f;
  p = p * c2 + -1.60960333262415e-02f;
  vf q = splat(-1.45660718464996e-05f);
  q = q * c2 + -2.13374055278905e-04f;
  q = q * c2 + -1.68282697438203e-03f;
  q = q * c2 + -7.37332916720468e-03f;
  q = q * c2 + -1.42647390514189e-02f;
  return c * p / q;
}

enum DenseActivation { kDenseLinear = 0, kDenseGelu = 1 };

static inline vf activate(vf v, int activation) {
  if (activation == kDenseGelu) return v * 0.5f * (1.0f + erf_rational(v * 0.70710678118654752f));
  return v;
}

}  // namespace
