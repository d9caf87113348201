"""Multi-head self-attention (`attention/self/{query,key,value}` in Google's names).

Scores are computed in the compute dtype and the softmax in float32: a float16 softmax over
512 positions with a -10000 padding bias loses the small probabilities that matter.
"""
import math

import tensorflow as tf

from modeling import core

# Added to the scores of padding positions: exp(-10000) is 0 in every float type and
# -10000 fits float16 (whose minimum is -65504).
MASK_BIAS = -10000.0


def attention_bias_from_mask(input_mask, dtype):
    """[batch, seq] 1/0 mask -> [batch, 1, 1, seq] additive bias (0 keep, -10000 drop)."""
    mask = tf.cast(input_mask, tf.float32)[:, tf.newaxis, tf.newaxis, :]
    return tf.cast((1.0 - mask) * MASK_BIAS, dtype)


def attention_bias_from_instance_ids(instance_ids, dtype):
    """[batch, seq] instance ids of a packed row (1, 2, ... per instance, 0 padding) ->
    [batch, 1, seq, seq] additive bias: a token attends only to real tokens of its own
    instance (block-diagonal), so packed instances cannot see each other.

    Keys outside the block get -10000, whose exp is exactly 0 in float32: each instance's
    softmax equals the one it has alone in an unpacked row.
    """
    ids = tf.cast(instance_ids, tf.int32)
    same = tf.equal(ids[:, :, tf.newaxis], ids[:, tf.newaxis, :])         # [batch, q, k]
    keep = tf.logical_and(same, tf.greater(ids, 0)[:, tf.newaxis, :])
    bias = (1.0 - tf.cast(keep, tf.float32)) * MASK_BIAS
    return tf.cast(bias[:, tf.newaxis, :, :], dtype)


def _split_heads(x, batch, seq, heads, head_size):
    """[batch*seq, heads*head_size] -> [batch, heads, seq, head_size]."""
    x = tf.reshape(x, [batch, seq, heads, head_size])
    return tf.transpose(x, [0, 2, 1, 3])


def select_query_bias(attention_bias, positions):
    """The rows of `attention_bias` for the queries at `positions` [batch, n]: a padding
    bias [batch, 1, 1, seq] serves every query as it is; a packed-row bias
    [batch, 1, seq, seq] becomes [batch, 1, n, seq]."""
    if attention_bias is None or attention_bias.shape[2] == 1:
        return attention_bias
    rows = tf.gather(attention_bias[:, 0], tf.cast(positions, tf.int32), batch_dims=1)
    return rows[:, tf.newaxis]


def self_attention(hidden, attention_bias, batch, seq, config, is_training, compute_dtype,
                   query_hidden=None, query_length=None, real_rows=None):
    """Scaled dot-product attention over all heads.

    hidden: [batch*seq, hidden] (any float dtype; projected in `compute_dtype`);
    attention_bias: [batch, 1, 1, seq] (padding) or [batch, 1, seq_q, seq] (packed rows) in
      `compute_dtype`, or None.
    query_hidden: None (every position queries), or [batch*query_length, hidden]: the rows
      that query, when only their outputs are needed (the last layer under pre-training
      heads reads only the masked and [CLS] positions). Keys and values still come from
      every position, so each selected row's output equals its row of the full layer.
    real_rows: None, or a `RealRows` of the batch: `hidden` then holds only the real tokens'
      rows [n, hidden], projected as they are and laid out as [batch, seq] for attention
      alone; the context returned is then [n, hidden] too.
    Returns the context [batch*seq_q, hidden] in `compute_dtype` (before the output
    projection), seq_q = query_length or seq.
    """
    heads, head_size = config.num_attention_heads, config.head_size
    hidden = tf.cast(hidden, compute_dtype)
    if query_hidden is None:
        query_hidden, query_length = hidden, seq
    query = core.dense(tf.cast(query_hidden, compute_dtype), heads * head_size, "query",
                       initializer_range=config.initializer_range)
    key = core.dense(hidden, heads * head_size, "key",
                     initializer_range=config.initializer_range)
    value = core.dense(hidden, heads * head_size, "value",
                       initializer_range=config.initializer_range)
    if real_rows is not None:  # [n, hidden] -> [batch*seq, hidden]
        query, key, value = (real_rows.pad(x) for x in (query, key, value))

    query = _split_heads(query, batch, query_length, heads, head_size)
    key = _split_heads(key, batch, seq, heads, head_size)
    value = _split_heads(value, batch, seq, heads, head_size)

    # [batch, heads, seq_q, seq_k]
    scores = core.matmul(query, key, transpose_b=True)
    scores = scores * tf.cast(1.0 / math.sqrt(head_size), scores.dtype)
    if attention_bias is not None:
        scores = scores + attention_bias
    probs = tf.cast(tf.nn.softmax(tf.cast(scores, tf.float32), axis=-1), hidden.dtype)
    probs = core.dropout(probs, config.attention_probs_dropout_prob, is_training)

    context = core.matmul(probs, value)                    # [batch, heads, seq_q, head_size]
    context = tf.transpose(context, [0, 2, 1, 3])          # [batch, seq_q, heads, head_size]
    context = tf.reshape(context, [batch * query_length, heads * head_size])
    return context if real_rows is None else real_rows.pack(context)
