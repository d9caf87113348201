// Our bfloat16 dense layer on AMX (its flags: finetuning/custom_ops.py); the epilogue's
// vectors and GELU are AVX-512's (vectors.h, activation.h).
#include "vectors.h"
#include "activation.h"
#include "dense_amx.h"
