// Our kernels compiled for avx2 (its flags: finetuning/custom_ops.py).
#include "vectors.h"

#define PACKED_ATTENTION_NAME packed_attention_avx2
#include "packed_attention.h"

#define LAYER_NORM_NAME add_layer_norm_avx2
#include "layer_norm.h"

#define DENSE_NAME dense_avx2
#include "dense.h"

#include "activation.h"
#include "dense_int8.h"
#include "dense_int8_avx2.h"
