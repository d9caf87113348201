// Our int8 dense layer on AVX-512 VNNI, and the quantization of its rows that AMX's shares
// (its flags: finetuning/custom_ops.py).
#include "vectors.h"
#include "activation.h"
#include "dense_int8.h"
#include "dense_vnni.h"
