// Self-attention over the packed real rows of a batch: the body of BertPackedAttention.
//
// Included by one unit per instruction set (kernels_{avx512,avx2,generic}.cc, after
// vectors.h), which defines PACKED_ATTENTION_NAME, the entry point's name for that set.
//
// One task is one (sequence, head): its keys are copied once, transposed, to float32 blocks
// [Lp / lanes][d][lanes] (Lp: the sequence's rows rounded up to the vector width; a block of
// scores reads its keys in one run) and its values to [L][d]; then kRows query rows at a time:
// scores against every key (vectors along the keys, each row's largest kept as they are
// stored, not found in a pass of its own), the softmax in float32, the context (vectors along
// the head's width). Everything a task reads stays in L1/L2 for BERT's head sizes (160 rows of
// width 32: 20 KB a copy). The largest kept at the store: one thread of a Zen 4, 12 heads of
// 64-384 rows, 1.13-1.26x with AVX2, 0.97-1.05x with AVX-512 (kept in a float array: as
// vectors, GCC held them in AVX-512's registers and spilled the sums, 0.73x).
namespace {

// scores[r][j .. j + V*kLanes) = queries[r] . keys[j ..] + bias[j ..], kRows rows; top[r]
// (a vector) becomes the lanewise largest of itself and those scores.
template <int V>
static inline void score_block(const float* queries, const float* keys_t, const float* bias,
                               float* scores, int d, int padded, int j, float* top) {
  vf acc[kRows][V] = {};
  const float* block = keys_t + static_cast<size_t>(j) * d;  // [V][d][kLanes], contiguous
  for (int c = 0; c < d; ++c) {
    vf k[V];
    for (int v = 0; v < V; ++v) k[v] = load(block + (v * d + c) * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const float q = queries[r * d + c];
      for (int v = 0; v < V; ++v) acc[r][v] += q * k[v];
    }
  }
  for (int v = 0; v < V; ++v) {
    const vf b = load(bias + j + v * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const vf s = acc[r][v] + b;
      store(scores + r * padded + j + v * kLanes, s);
      const vf t = load(top + r * kLanes);
      store(top + r * kLanes, s > t ? s : t);
    }
  }
}

// out[r][c .. c + V*kLanes) = sum_j probs[r][j] values[j][c ..], kRows rows, unnormalised.
template <int V>
static inline void context_block(const float* probs, const float* values, float* out, int d,
                                 int padded, int length, int c) {
  vf acc[kRows][V] = {};
  for (int j = 0; j < length; ++j) {
    vf value[V];
    for (int v = 0; v < V; ++v) value[v] = load(values + j * d + c + v * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const float p = probs[r * padded + j];
      for (int v = 0; v < V; ++v) acc[r][v] += p * value[v];
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < V; ++v) store(out + r * d + c + v * kLanes, acc[r][v]);
}

template <typename T>
void attend(const T* query, const T* key, const T* value, T* context, int hidden, int head_size,
            float scale, int start, int length, const uint8_t* key_valid, int head) {
  const int d = head_size, padded = (length + kLanes - 1) / kLanes * kLanes;
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(d) * padded + static_cast<size_t>(length) * d + padded
                 + 2 * kRows * d + kRows * padded);
  float* keys_t = scratch.data();                 // [d][padded]
  float* values = keys_t + d * padded;            // [length][d]
  float* bias = values + length * d;              // [padded]: 0 or -1e30 (masked, beyond)
  float* queries = bias + padded;                 // [kRows][d], scaled
  float* outs = queries + kRows * d;              // [kRows][d]
  float* probs = outs + kRows * d;                // [kRows][padded]
  bool any_valid = false;
  for (int j = 0; j < length; ++j) any_valid |= key_valid[start + j] != 0;
  for (int j = 0; j < padded; ++j)
    bias[j] = j < length && (!any_valid || key_valid[start + j]) ? 0.0f : -1e30f;
  for (int j = 0; j < padded; ++j) {
    const T* row = key + static_cast<size_t>(start + (j < length ? j : 0)) * hidden + head * d;
    float* column = keys_t + (j / kLanes) * d * kLanes + j % kLanes;
    for (int c = 0; c < d; ++c) column[c * kLanes] = j < length ? to_float(row[c]) : 0.0f;
  }
  for (int j = 0; j < length; ++j) {
    const T* row = value + static_cast<size_t>(start + j) * hidden + head * d;
    for (int c = 0; c < d; ++c) values[j * d + c] = to_float(row[c]);
  }
  for (int first = 0; first < length; first += kRows) {
    const int rows = length - first < kRows ? length - first : kRows;
    for (int r = 0; r < kRows; ++r) {  // rows past the last repeat the first: computed, not kept
      const T* row = query + static_cast<size_t>(start + first + (r < rows ? r : 0)) * hidden + head * d;
      for (int c = 0; c < d; ++c) queries[r * d + c] = to_float(row[c]) * scale;
    }
    float top[kRows * kLanes];  // each row's largest score so far, a vector of lanes
    for (int r = 0; r < kRows; ++r) store(top + r * kLanes, splat(-3e38f));
    int j = 0;
    for (; j + kVectors * kLanes <= padded; j += kVectors * kLanes)
      score_block<kVectors>(queries, keys_t, bias, probs, d, padded, j, top);
    for (; j < padded; j += kLanes) score_block<1>(queries, keys_t, bias, probs, d, padded, j, top);
    float inverse_sum[kRows];
    for (int r = 0; r < kRows; ++r) {
      float* p = probs + r * padded;
      const vf m = splat(lane_max(load(top + r * kLanes)));
      vf total = {};
      for (int i = 0; i < padded; i += kLanes) {
        vf e = exp_nonpositive(load(p + i) - m);
        store(p + i, e);
        total += e;
      }
      inverse_sum[r] = 1.0f / lane_sum(total);
    }
    int c = 0;
    for (; c + kVectors * kLanes <= d; c += kVectors * kLanes)
      context_block<kVectors>(probs, values, outs, d, padded, length, c);
    for (; c < d; c += kLanes) context_block<1>(probs, values, outs, d, padded, length, c);
    for (int r = 0; r < rows; ++r) {
      T* out = context + static_cast<size_t>(start + first + r) * hidden + head * d;
      for (int i = 0; i < d; ++i) from_float(outs[r * d + i] * inverse_sum[r], out + i);
    }
  }
}

}  // namespace

// Tasks [begin, end) of sequence * heads + head; `bf16` says whether the four matrices hold
// bfloat16 (else float32). head_size must be a multiple of 16.
extern "C" void PACKED_ATTENTION_NAME(const void* query, const void* key, const void* value,
                                      void* context, int bf16, int hidden, int heads,
                                      int head_size, float scale, const int* starts,
                                      const int* lengths, const uint8_t* key_valid,
                                      int64_t begin, int64_t end) {
  for (int64_t task = begin; task < end; ++task) {
    const int sequence = static_cast<int>(task / heads), head = static_cast<int>(task % heads);
    if (lengths[sequence] == 0) continue;
    if (bf16)
      attend(static_cast<const uint16_t*>(query), static_cast<const uint16_t*>(key),
             static_cast<const uint16_t*>(value), static_cast<uint16_t*>(context), hidden,
             head_size, scale, starts[sequence], lengths[sequence], key_valid, head);
    else
      attend(static_cast<const float*>(query), static_cast<const float*>(key),
             static_cast<const float*>(value), static_cast<float*>(context), hidden, head_size,
             scale, starts[sequence], lengths[sequence], key_valid, head);
  }
}
