// Stands in for kernels_amx.cc where the compiler knows no AMX (finetuning/custom_ops.py):
// the process may not use the tiles, so the bfloat16 dense op refuses to be built and the
// rewrite never asks for it (nor for the VDPBF16PS code, which the AMX unit holds).
#include <cstdint>

extern "C" int amx_request_tiles() { return 0; }
extern "C" void pack_rows_bf16(const uint16_t*, uint16_t*, int64_t, int64_t, int64_t, int64_t) {}
extern "C" void dense_bf16_amx(const uint16_t*, const uint16_t*, const float*, uint16_t*,
                               int64_t, int64_t, int64_t, int, int64_t, int64_t) {}
extern "C" void dense_int8_amx(const uint8_t*, const float*, const float*, const int8_t*,
                               const float*, const float*, const float*, float*, int64_t, int64_t,
                               int64_t, int, int64_t, int64_t) {}
extern "C" void dense_bf16_dpbf16(const uint16_t*, const uint16_t*, const float*, uint16_t*,
                                  int64_t, int64_t, int64_t, int, int64_t, int64_t) {}
