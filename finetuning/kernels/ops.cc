// Our TensorFlow ops for the serving graph (finetuning/custom_ops.py builds them, the
// rewrites in finetuning/packed_attention.py and finetuning/add_layer_norm.py use them).
//
// BertPackedAttention: BERT's self-attention on the real rows of a batch, as one op.
//
// query, key, value: [n, hidden] (float32 or bfloat16), the projections of the batch's real
// tokens only (modeling/real_rows.py: row by row, sequence after sequence, each sequence's
// position 0 kept); input_mask: [batch, seq] int32, which says where those rows sit.
// context: [n, hidden], what the exported graph computes for those rows by padding them back
// to [batch, seq], splitting heads, scaling, masking, softmax and the context product, then
// packing again. A query attends to its own sequence's rows whose mask is 1 (all of them
// where none is, as a softmax over equal -10000 biases does).
//
// BertAddLayerNorm: y = layer_norm(x + residual) over the last axis, float32, and y_low: y as
// Tlow (bfloat16 for the next bf16 products; y itself where Tlow is float32).
//
// BertDense: y = activation(x · W + bias), x [rows, k] and y float32 or bfloat16, W given
// packed ([n / 32, k, 32]: finetuning/packed_dense.py; in bfloat16 tile by tile, dense_amx.h),
// bias float32, activation "linear" or "gelu" (exact); bfloat16 on AMX's tiles (`isa` "amx")
// or AVX512_BF16's VDPBF16PS ("avx512_bf16", dense_dpbf16.h).
//
// Each op's parallel loop runs on one team of threads all our ops share (team.h).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"
#include "team.h"

using namespace tensorflow;  // NOLINT

typedef void (*AttentionFn)(const void*, const void*, const void*, void*, int, int, int, int,
                            float, const int*, const int*, const uint8_t*, int64_t, int64_t);

typedef void (*LayerNormFn)(const void*, const float*, const float*, const float*, float,
                            float*, uint16_t*, int, int, int64_t, int64_t);

typedef void (*DenseFn)(const float*, const float*, const float*, float*, int64_t, int64_t,
                        int64_t, int, int64_t, int64_t);

extern "C" {
void dense_avx512(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t,
                  int, int64_t, int64_t);
void dense_avx2(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, int,
                int64_t, int64_t);
void dense_generic(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t,
                   int, int64_t, int64_t);
int amx_request_tiles();
void pack_rows_bf16(const uint16_t*, uint16_t*, int64_t, int64_t, int64_t, int64_t);
void dense_bf16_amx(const uint16_t*, const uint16_t*, const float*, uint16_t*, int64_t, int64_t,
                    int64_t, int, int64_t, int64_t);
void dense_bf16_dpbf16(const uint16_t*, const uint16_t*, const float*, uint16_t*, int64_t,
                       int64_t, int64_t, int, int64_t, int64_t);
void quantize_rows_u8(const float*, uint8_t*, float*, float*, int64_t, int64_t, int64_t, int64_t,
                      int);
void quantize_rows_u8_avx2(const float*, uint8_t*, float*, float*, int64_t, int64_t, int64_t,
                           int64_t, int);
void dense_int8_amx(const uint8_t*, const float*, const float*, const int8_t*, const float*,
                    const float*, const float*, float*, int64_t, int64_t, int64_t, int, int64_t,
                    int64_t);
void dense_int8_vnni(const uint8_t*, const float*, const float*, const int8_t*, const float*,
                     const float*, const float*, float*, int64_t, int64_t, int64_t, int, int64_t,
                     int64_t);
void dense_int8_avx2(const uint8_t*, const float*, const float*, const int8_t*, const float*,
                     const float*, const float*, float*, int64_t, int64_t, int64_t, int, int64_t,
                     int64_t);
void add_layer_norm_avx512(const void*, const float*, const float*, const float*, float, float*,
                           uint16_t*, int, int, int64_t, int64_t);
void add_layer_norm_avx2(const void*, const float*, const float*, const float*, float, float*,
                         uint16_t*, int, int, int64_t, int64_t);
void add_layer_norm_generic(const void*, const float*, const float*, const float*, float, float*,
                            uint16_t*, int, int, int64_t, int64_t);
void packed_attention_avx512(const void*, const void*, const void*, void*, int, int, int, int,
                             float, const int*, const int*, const uint8_t*, int64_t, int64_t);
void packed_attention_avx2(const void*, const void*, const void*, void*, int, int, int, int,
                           float, const int*, const int*, const uint8_t*, int64_t, int64_t);
void packed_attention_generic(const void*, const void*, const void*, void*, int, int, int, int,
                              float, const int*, const int*, const uint8_t*, int64_t, int64_t);
}

// Runs work(begin, end) over [0, total) units of about `cost` flops each: on the team of
// threads our ops share (team.h), on the caller alone where that is little work, and on
// TensorFlow's Shard where the team is switched off (BERT_TEAM=0) or held by another op.
static void ParallelFor(OpKernelContext* context, int64_t total, int64_t cost,
                        const std::function<void(int64_t, int64_t)>& work) {
  auto* threads = context->device()->tensorflow_cpu_worker_threads();
  team::Team* shared = team::Shared(threads->num_threads);
  if (shared != nullptr) {
    if (total <= 1 || total * cost < team::kInlineCost) return work(0, total);
    // units a claim takes: a thread's share in one contiguous part, so that a dense op's
    // thread reuses each chunk of x over all its panels (one panel a claim re-read all of x
    // for each: 0.96x Shard at SQuAD batch 32 under an AVX2 cap, 1.10x with shares); a late
    // thread's share is still taken by the caller
    const int64_t grain = (total + threads->num_threads - 1) / threads->num_threads;
    if (shared->Run(total, grain, work)) return;
  }
  Shard(threads->num_threads, threads->workers, total, cost, work);
}

REGISTER_OP("BertPackedAttention")
    .Input("query: T")
    .Input("key: T")
    .Input("value: T")
    .Input("input_mask: int32")
    .Output("context: T")
    .Attr("T: {float, bfloat16}")
    .Attr("num_heads: int >= 1")
    .Attr("scale: float")
    .Attr("isa: {'avx512', 'avx2', 'generic'} = 'generic'")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return OkStatus();
    });

REGISTER_OP("BertAddLayerNorm")
    .Input("x: T")
    .Input("residual: float")
    .Input("gamma: float")
    .Input("beta: float")
    .Output("y: float")
    .Output("y_low: Tlow")
    .Attr("T: {float, bfloat16}")
    .Attr("Tlow: {float, bfloat16} = DT_FLOAT")
    .Attr("epsilon: float")
    .Attr("isa: {'avx512', 'avx2', 'generic'} = 'generic'")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(0));
      return OkStatus();
    });

// The dense ops' y: [x's rows, the packed kernel's panels x panel width].
static Status DenseShape(shape_inference::InferenceContext* c) {
  shape_inference::ShapeHandle x, kernel;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 3, &kernel));
  shape_inference::DimensionHandle columns;
  TF_RETURN_IF_ERROR(c->Multiply(c->Dim(kernel, 0), c->Dim(kernel, 2), &columns));
  c->set_output(0, c->Matrix(c->Dim(x, 0), columns));
  return OkStatus();
}

REGISTER_OP("BertDense")
    .Input("x: T")
    .Input("packed_kernel: T")
    .Input("bias: float")
    .Output("y: T")
    .Attr("T: {float, bfloat16} = DT_FLOAT")
    .Attr("activation: {'linear', 'gelu'} = 'linear'")
    .Attr("isa: {'avx512', 'avx2', 'generic', 'amx', 'avx512_bf16'} = 'generic'")
    .SetShapeFn(DenseShape);

REGISTER_OP("BertDenseInt8")
    .Input("x: float")
    .Input("packed_kernel: int8")
    .Input("scale: float")
    .Input("weight_sums: float")
    .Input("bias: float")
    .Output("y: float")
    .Attr("activation: {'linear', 'gelu'} = 'linear'")
    .Attr("isa: {'amx', 'avx512_vnni', 'avx2'} = 'amx'")
    .SetShapeFn(DenseShape);

// The widest instruction set at or below `isa` that this CPU runs.
static std::string Widest(const std::string& isa) {
  __builtin_cpu_init();
  if (isa == "avx512" && __builtin_cpu_supports("avx512f")) return "avx512";
  if (isa != "generic" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return "avx2";
  return "generic";
}

static AttentionFn ChooseAttention(const std::string& isa) {
  const std::string widest = Widest(isa);
  return widest == "avx512" ? packed_attention_avx512
         : widest == "avx2" ? packed_attention_avx2 : packed_attention_generic;
}

static LayerNormFn ChooseLayerNorm(const std::string& isa) {
  const std::string widest = Widest(isa);
  return widest == "avx512" ? add_layer_norm_avx512
         : widest == "avx2" ? add_layer_norm_avx2 : add_layer_norm_generic;
}

static DenseFn ChooseDense(const std::string& isa) {
  const std::string widest = Widest(isa);
  return widest == "avx512" ? dense_avx512 : widest == "avx2" ? dense_avx2 : dense_generic;
}

template <typename T>
class PackedAttentionOp : public OpKernel {
 public:
  explicit PackedAttentionOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("num_heads", &heads_));
    OP_REQUIRES_OK(context, context->GetAttr("scale", &scale_));
    std::string isa;
    OP_REQUIRES_OK(context, context->GetAttr("isa", &isa));
    attend_ = ChooseAttention(isa);
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& query = context->input(0);
    const Tensor& key = context->input(1);
    const Tensor& value = context->input(2);
    const Tensor& mask = context->input(3);
    OP_REQUIRES(context, query.dims() == 2 && key.shape() == query.shape() &&
                             value.shape() == query.shape(),
                errors::InvalidArgument("query, key and value must be one [rows, hidden] shape"));
    OP_REQUIRES(context, mask.dims() == 2, errors::InvalidArgument("input_mask must be [batch, seq]"));
    const int64_t rows = query.dim_size(0), hidden = query.dim_size(1);
    OP_REQUIRES(context, hidden % heads_ == 0 && (hidden / heads_) % 16 == 0,
                errors::InvalidArgument("hidden ", hidden, " is not num_heads ", heads_,
                                        " heads of a multiple of 16"));
    const int batch = static_cast<int>(mask.dim_size(0)), seq = static_cast<int>(mask.dim_size(1));
    const int32_t* flags = mask.flat<int32_t>().data();
    std::vector<int> starts(batch), lengths(batch);
    std::vector<uint8_t> key_valid;
    key_valid.reserve(rows);
    for (int b = 0; b < batch; ++b) {
      starts[b] = static_cast<int>(key_valid.size());
      for (int j = 0; j < seq; ++j) {
        const bool real = flags[b * seq + j] != 0;
        if (j == 0 || real) key_valid.push_back(real ? 1 : 0);
      }
      lengths[b] = static_cast<int>(key_valid.size()) - starts[b];
    }
    OP_REQUIRES(context, static_cast<int64_t>(key_valid.size()) == rows,
                errors::InvalidArgument("input_mask holds ", key_valid.size(),
                                        " real rows, query ", rows));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, query.shape(), &output));
    if (rows == 0) return;
    const int head_size = static_cast<int>(hidden / heads_);
    int64_t longest = 0;
    for (int length : lengths) longest = length > longest ? length : longest;
    const int64_t cost = 4 * longest * longest * head_size;  // a (sequence, head)'s flops
    const bool bf16 = DataTypeToEnum<T>::value == DT_BFLOAT16;
    const void* q = query.tensor_data().data();
    const void* k = key.tensor_data().data();
    const void* v = value.tensor_data().data();
    void* out = const_cast<char*>(output->tensor_data().data());
    const int heads = heads_, width = static_cast<int>(hidden);
    const float scale = scale_;
    AttentionFn attend = attend_;
    auto work = [&](int64_t begin, int64_t end) {
      attend(q, k, v, out, bf16, width, heads, head_size, scale, starts.data(), lengths.data(),
             key_valid.data(), begin, end);
    };
    ParallelFor(context, static_cast<int64_t>(batch) * heads, cost, work);
  }

 private:
  int heads_;
  float scale_;
  AttentionFn attend_;
};

REGISTER_KERNEL_BUILDER(Name("BertPackedAttention").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        PackedAttentionOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("BertPackedAttention").Device(DEVICE_CPU).TypeConstraint<bfloat16>("T"),
    PackedAttentionOp<bfloat16>);

template <typename T, typename Tlow>
class AddLayerNormOp : public OpKernel {
 public:
  explicit AddLayerNormOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &epsilon_));
    std::string isa;
    OP_REQUIRES_OK(context, context->GetAttr("isa", &isa));
    normalize_ = ChooseLayerNorm(isa);
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& residual = context->input(1);
    const Tensor& gamma = context->input(2);
    const Tensor& beta = context->input(3);
    OP_REQUIRES(context, x.dims() >= 1 && residual.shape() == x.shape(),
                errors::InvalidArgument("x and residual must be one shape"));
    const int64_t width = x.dim_size(x.dims() - 1);
    OP_REQUIRES(context, gamma.dims() == 1 && gamma.dim_size(0) == width &&
                             beta.shape() == gamma.shape(),
                errors::InvalidArgument("gamma and beta must be [", width, "]"));
    Tensor* y = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, x.shape(), &y));
    uint16_t* low = nullptr;
    if (DataTypeToEnum<Tlow>::value == DT_FLOAT) {
      context->set_output(1, *y);
    } else {
      Tensor* low_tensor = nullptr;
      OP_REQUIRES_OK(context, context->allocate_output(1, x.shape(), &low_tensor));
      low = reinterpret_cast<uint16_t*>(const_cast<char*>(low_tensor->tensor_data().data()));
    }
    const int64_t rows = width == 0 ? 0 : x.NumElements() / width;
    if (rows == 0) return;
    const void* in = x.tensor_data().data();
    const float* res = residual.flat<float>().data();
    const float* g = gamma.flat<float>().data();
    const float* b = beta.flat<float>().data();
    float* out = y->flat<float>().data();
    const bool bf16 = DataTypeToEnum<T>::value == DT_BFLOAT16;
    const float epsilon = epsilon_;
    const int columns = static_cast<int>(width);
    LayerNormFn normalize = normalize_;
    auto work = [&](int64_t begin, int64_t end) {
      normalize(in, res, g, b, epsilon, out, low, bf16, columns, begin, end);
    };
    ParallelFor(context, rows, 12 * width, work);
  }

 private:
  float epsilon_;
  LayerNormFn normalize_;
};

#define REGISTER_ADD_LAYER_NORM(T, Tlow)                                             \
  REGISTER_KERNEL_BUILDER(Name("BertAddLayerNorm")                                  \
                              .Device(DEVICE_CPU)                                   \
                              .TypeConstraint<T>("T")                               \
                              .TypeConstraint<Tlow>("Tlow"),                        \
                          AddLayerNormOp<T, Tlow>);
REGISTER_ADD_LAYER_NORM(float, float)
REGISTER_ADD_LAYER_NORM(float, bfloat16)
REGISTER_ADD_LAYER_NORM(bfloat16, float)
REGISTER_ADD_LAYER_NORM(bfloat16, bfloat16)

// Whether the process may use AMX's tiles (asked once: Linux grants them for its life), as
// the op `what` needs them to be built.
static Status AmxTiles(const char* what) {
  if (amx_request_tiles() == 1) return OkStatus();
  return errors::Unavailable(what, " runs on AMX tiles, and this process may not use them "
                             "(the CPU has none, the library was built without them, or the "
                             "kernel refused ARCH_REQ_XCOMP_PERM)");
}

// The dense ops' x [rows, k] and packed kernel [n / 32, k, 32], k a multiple of `depth_unit`
// (the tiles' depth: 32 for bfloat16 pairs, 64 for int8 quads, 1 for our vector code).
static Status DenseOperands(const Tensor& x, const Tensor& kernel, int64_t depth_unit,
                            int64_t* rows, int64_t* depth, int64_t* panels) {
  constexpr int64_t kPanel = 32;
  if (x.dims() != 2) return errors::InvalidArgument("x must be [rows, k]");
  *rows = x.dim_size(0);
  *depth = x.dim_size(1);
  if (*depth % depth_unit != 0)
    return errors::InvalidArgument("k must be a multiple of ", depth_unit, " for this op's tiles, not ",
                                   *depth);
  if (kernel.dims() != 3 || kernel.dim_size(1) != *depth || kernel.dim_size(2) != kPanel)
    return errors::InvalidArgument("packed_kernel must be [n / ", kPanel, ", ", *depth, ", ",
                                   kPanel, "]");
  *panels = kernel.dim_size(0);
  return OkStatus();
}

// float32: our vector kernel (dense.h), `isa` choosing its code. bfloat16: AMX's tiles
// (`isa` "amx", dense_amx.h), x packed tile by tile on every call, or AVX512_BF16's
// VDPBF16PS ("avx512_bf16", dense_dpbf16.h), x read in place; the op refuses to be built where
// the process may not use them (finetuning/packed_dense.py rewrites to it only where it may).
template <typename T>
class DenseOp : public OpKernel {
 public:
  static constexpr int64_t kPanel = 32;  // kDensePanel in dense.h, kAmxBlock in dense_amx.h
  static constexpr bool kBf16 = std::is_same<T, bfloat16>::value;
  explicit DenseOp(OpKernelConstruction* context) : OpKernel(context) {
    std::string activation, isa;
    OP_REQUIRES_OK(context, context->GetAttr("activation", &activation));
    OP_REQUIRES_OK(context, context->GetAttr("isa", &isa));
    gelu_ = activation == "gelu";
    dense_ = ChooseDense(isa);
    if (!kBf16) return;
    tiles_ = isa != "avx512_bf16";
    __builtin_cpu_init();
    if (tiles_) OP_REQUIRES_OK(context, AmxTiles("BertDense in bfloat16"));
    else
      OP_REQUIRES(context, __builtin_cpu_supports("avx512bf16"),
                  errors::Unavailable("BertDense with isa=avx512_bf16 needs a CPU with "
                                      "AVX512_BF16, and this one has none"));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& kernel = context->input(1);
    const Tensor& bias = context->input(2);
    int64_t rows, depth, panels;
    OP_REQUIRES_OK(context, DenseOperands(x, kernel, kBf16 ? kPanel : 1, &rows, &depth, &panels));
    const int64_t columns = panels * kPanel;
    OP_REQUIRES(context, bias.dims() == 1 && bias.dim_size(0) == columns,
                errors::InvalidArgument("bias must be [", columns, "]"));
    Tensor* y = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({rows, columns}), &y));
    if (rows == 0 || columns == 0) return;
    const float* b = bias.flat<float>().data();
    const int activation = gelu_ ? 1 : 0;
    std::function<void(int64_t, int64_t)> work;
    Tensor x_packed;
    int64_t cost = 2 * rows * depth * kPanel;  // a panel's flops
    if (kBf16 && !tiles_) {
      const uint16_t* in = reinterpret_cast<const uint16_t*>(x.tensor_data().data());
      const uint16_t* packed = reinterpret_cast<const uint16_t*>(kernel.tensor_data().data());
      uint16_t* out = reinterpret_cast<uint16_t*>(const_cast<char*>(y->tensor_data().data()));
      work = [=](int64_t begin, int64_t end) {
        dense_bf16_dpbf16(in, packed, b, out, rows, depth, columns, activation, begin, end);
      };
      cost /= 2;  // a VDPBF16PS does two products a lane
    } else if (kBf16) {
      const int64_t padded = (rows + kPanel - 1) / kPanel * kPanel;
      OP_REQUIRES_OK(context, context->allocate_temp(DT_BFLOAT16, TensorShape({padded, depth}),
                                                     &x_packed));
      const uint16_t* in = reinterpret_cast<const uint16_t*>(x.tensor_data().data());
      uint16_t* tiles = reinterpret_cast<uint16_t*>(const_cast<char*>(x_packed.tensor_data().data()));
      ParallelFor(context, padded / kPanel, kPanel * depth, [=](int64_t begin, int64_t end) {
        pack_rows_bf16(in, tiles, rows, depth, begin, end);
      });
      const uint16_t* packed = reinterpret_cast<const uint16_t*>(kernel.tensor_data().data());
      uint16_t* out = reinterpret_cast<uint16_t*>(const_cast<char*>(y->tensor_data().data()));
      work = [=](int64_t begin, int64_t end) {
        dense_bf16_amx(tiles, packed, b, out, rows, depth, columns, activation, begin, end);
      };
      cost /= 8;  // tiles multiply several times faster than vectors
    } else {
      const float* in = reinterpret_cast<const float*>(x.tensor_data().data());
      const float* packed = reinterpret_cast<const float*>(kernel.tensor_data().data());
      float* out = reinterpret_cast<float*>(const_cast<char*>(y->tensor_data().data()));
      DenseFn dense = dense_;
      work = [=](int64_t begin, int64_t end) {
        dense(in, packed, b, out, rows, depth, columns, activation, begin, end);
      };
    }
    ParallelFor(context, panels, cost, work);
  }

 private:
  bool gelu_, tiles_ = false;
  DenseFn dense_;
};

REGISTER_KERNEL_BUILDER(Name("BertDense").Device(DEVICE_CPU).TypeConstraint<float>("T"),
                        DenseOp<float>);
REGISTER_KERNEL_BUILDER(Name("BertDense").Device(DEVICE_CPU).TypeConstraint<bfloat16>("T"),
                        DenseOp<bfloat16>);

// BertDenseInt8: y = activation(x · W + bias), float32 in and out, on AMX-INT8, AVX-512 VNNI or
// AVX2 (`isa`): each row of x quantized on the fly to 0..255 (AVX2: 0..127) with its own low
// and step, W given as int8 codes packed tile by tile ([n / 32, k, 32]: dense_int8.h) with
// each column's scale and scale · sum of its codes. The op refuses to be built where the CPU
// (or process) lacks `isa`.
class DenseInt8Op : public OpKernel {
 public:
  static constexpr int64_t kPanel = 32, kDepthBlock = 64;
  explicit DenseInt8Op(OpKernelConstruction* context) : OpKernel(context) {
    std::string activation, isa;
    OP_REQUIRES_OK(context, context->GetAttr("activation", &activation));
    OP_REQUIRES_OK(context, context->GetAttr("isa", &isa));
    gelu_ = activation == "gelu";
    amx_ = isa == "amx";
    __builtin_cpu_init();
    if (amx_) {
      OP_REQUIRES_OK(context, AmxTiles("BertDenseInt8"));
      quantize_ = quantize_rows_u8;
      dense_ = dense_int8_amx;
    } else if (isa == "avx512_vnni") {
      OP_REQUIRES(context, __builtin_cpu_supports("avx512vnni") &&
                               __builtin_cpu_supports("avx512bw"),
                  errors::Unavailable("BertDenseInt8 with isa=avx512_vnni needs a CPU with "
                                      "AVX-512 VNNI, and this one has none"));
      quantize_ = quantize_rows_u8;
      dense_ = dense_int8_vnni;
    } else {
      OP_REQUIRES(context, __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"),
                  errors::Unavailable("BertDenseInt8 with isa=avx2 needs a CPU with AVX2, and "
                                      "this one has none"));
      quantize_ = quantize_rows_u8_avx2;
      dense_ = dense_int8_avx2;
      levels_ = 127;  // its pairs of products are summed in 16 bits (dense_int8_avx2.h)
    }
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& kernel = context->input(1);
    int64_t rows, depth, panels;
    OP_REQUIRES_OK(context, DenseOperands(x, kernel, kDepthBlock, &rows, &depth, &panels));
    const int64_t columns = panels * kPanel;
    for (int input = 2; input < 5; ++input)
      OP_REQUIRES(context, context->input(input).dims() == 1 &&
                               context->input(input).dim_size(0) == columns,
                  errors::InvalidArgument("scale, weight_sums and bias must be [", columns, "]"));
    Tensor* y = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({rows, columns}), &y));
    if (rows == 0 || columns == 0) return;
    const int64_t padded = (rows + kPanel - 1) / kPanel * kPanel;
    Tensor codes, lows, steps;
    OP_REQUIRES_OK(context, context->allocate_temp(DT_UINT8, TensorShape({padded, depth}), &codes));
    OP_REQUIRES_OK(context, context->allocate_temp(DT_FLOAT, TensorShape({rows}), &lows));
    OP_REQUIRES_OK(context, context->allocate_temp(DT_FLOAT, TensorShape({rows}), &steps));
    const float* in = x.flat<float>().data();
    uint8_t* packed_codes = codes.flat<uint8_t>().data();
    float* low = lows.flat<float>().data();
    float* step = steps.flat<float>().data();
    const auto quantize = quantize_;
    const int levels = levels_;
    ParallelFor(context, padded / kPanel, 4 * kPanel * depth, [=](int64_t begin, int64_t end) {
      quantize(in, packed_codes, low, step, rows, depth, begin, end, levels);
    });
    const int8_t* weights = kernel.flat<int8_t>().data();
    const float* scale = context->input(2).flat<float>().data();
    const float* sums = context->input(3).flat<float>().data();
    const float* b = context->input(4).flat<float>().data();
    float* out = y->flat<float>().data();
    const int activation = gelu_ ? 1 : 0;
    const auto dense = dense_;
    // a panel's cost, in float32 multiply-adds: tiles multiply several times faster
    const int64_t cost = rows * depth * kPanel / (amx_ ? 8 : 2);
    ParallelFor(context, panels, cost, [=](int64_t begin, int64_t end) {
      dense(packed_codes, low, step, weights, scale, sums, b, out, rows, depth, columns,
            activation, begin, end);
    });
  }

 private:
  bool gelu_, amx_;
  int levels_ = 255;
  decltype(&quantize_rows_u8) quantize_;
  decltype(&dense_int8_amx) dense_;
};

REGISTER_KERNEL_BUILDER(Name("BertDenseInt8").Device(DEVICE_CPU), DenseInt8Op);

