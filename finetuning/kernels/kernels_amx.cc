// Our bfloat16 and int8 dense layers on AMX (its flags: finetuning/custom_ops.py); the epilogue's
// vectors and GELU are AVX-512's (vectors.h, activation.h).
#include "vectors.h"
#include "activation.h"
#include "dense_int8.h"
#include "dense_amx.h"
