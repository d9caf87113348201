// Our bfloat16 and int8 dense layers on AMX, and bfloat16 on AVX512_BF16's VDPBF16PS for CPUs
// without AMX (its flags: finetuning/custom_ops.py; a compiler that knows AMX knows
// AVX512_BF16); the epilogue's vectors and GELU are AVX-512's (vectors.h, activation.h).
#include "vectors.h"
#include "activation.h"
#include "dense_int8.h"
#include "dense_amx.h"
#include "dense_dpbf16.h"
