// A residual add and layer norm over rows, one pass of each row: the body of BertAddLayerNorm.
//
// Included by the same per-instruction-set units as the attention kernel (its vectors, its
// conversions), with LAYER_NORM_NAME naming the entry point. y = layer_norm(x + residual) in
// float32, written as float32 and, where `low` is given, also as bfloat16 for the next
// layer's bfloat16 products (the cast that would otherwise follow it, a pass of its own).

// rows [begin, end) of [rows, width]; `bf16` says whether x holds bfloat16 (else float32).
extern "C" void LAYER_NORM_NAME(const void* x, const float* residual, const float* gamma,
                                const float* beta, float epsilon, float* y, uint16_t* low,
                                int bf16, int width, int64_t begin, int64_t end) {
  thread_local std::vector<float> scratch;
  scratch.resize(width);
  float* row = scratch.data();  // once: a thread_local's every use goes through its TLS wrapper
  const int vectors = width / kLanes * kLanes;
  for (int64_t r = begin; r < end; ++r) {
    const size_t offset = static_cast<size_t>(r) * width;
    const float* res = residual + offset;
    if (bf16) {
      const uint16_t* in = static_cast<const uint16_t*>(x) + offset;
      for (int i = 0; i < width; ++i) row[i] = to_float(in[i]) + res[i];
    } else {
      const float* in = static_cast<const float*>(x) + offset;
      for (int i = 0; i < width; ++i) row[i] = in[i] + res[i];
    }
    vf total[4] = {};  // four chains of adds, not one: an add waits ~4 cycles for the last
    int i = 0;
    for (; i < vectors; i += kLanes) total[(i / kLanes) & 3] += load(row + i);
    float sum = lane_sum((total[0] + total[1]) + (total[2] + total[3]));
    for (; i < width; ++i) sum += row[i];
    const float mean = sum / width;
    vf squares[4] = {};
    for (i = 0; i < vectors; i += kLanes) {
      const vf centred = load(row + i) - mean;
      squares[(i / kLanes) & 3] += centred * centred;
    }
    float square_sum = lane_sum((squares[0] + squares[1]) + (squares[2] + squares[3]));
    for (; i < width; ++i) square_sum += (row[i] - mean) * (row[i] - mean);
    const float inverse = 1.0f / std::sqrt(square_sum / width + epsilon);
    float* out = y + offset;
    for (i = 0; i < vectors; i += kLanes)
      store(out + i, (load(row + i) - mean) * inverse * load(gamma + i) + load(beta + i));
    for (; i < width; ++i) out[i] = (row[i] - mean) * inverse * gamma[i] + beta[i];
    if (low != nullptr)
      for (i = 0; i < width; ++i) from_float(out[i], low + offset + i);
  }
}
