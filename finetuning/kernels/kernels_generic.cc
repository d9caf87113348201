// Our kernels compiled for generic (its flags: finetuning/custom_ops.py).
#include "vectors.h"

#define PACKED_ATTENTION_NAME packed_attention_generic
#include "packed_attention.h"

#define LAYER_NORM_NAME add_layer_norm_generic
#include "layer_norm.h"

#define DENSE_NAME dense_generic
#include "dense.h"
