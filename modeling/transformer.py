"""The Transformer encoder stack (`encoder/layer_N/...` in Google's names).

Each layer: self-attention -> output projection -> dropout -> residual + LayerNorm ->
intermediate dense with the config's activation -> output dense -> dropout -> residual +
LayerNorm (post-LN, as in the original BERT). Activations travel as a 2-D
[batch*seq, hidden] float32 matrix between layers (the residual stream), so every projection
is one large GEMM; each projection casts its input to the compute dtype.
"""
import tensorflow as tf

from modeling import core
from modeling.activations import get_activation
from modeling.attention import select_query_bias, self_attention

tf1 = tf.compat.v1


def _output_projection(inputs, residual, config, is_training):
    """dense to hidden_size -> dropout -> LayerNorm(+ residual), in the current scope.

    inputs: [batch*seq, width] in the compute dtype; residual: [batch*seq, hidden] float32.
    Returns [batch*seq, hidden] float32 (the residual stream stays in float32).
    """
    output = core.dense(inputs, config.hidden_size, "dense",
                        initializer_range=config.initializer_range)
    output = core.dropout(tf.cast(output, tf.float32), config.hidden_dropout_prob, is_training)
    return core.layer_norm(output + residual, epsilon=config.layer_norm_eps)


def transformer_layer(hidden, attention_bias, batch, seq, config, is_training, compute_dtype,
                      query_positions=None, real_rows=None):
    """One encoder layer: [batch*seq, hidden] float32 -> [batch*seq, hidden] float32.

    With `query_positions` [batch, n] it returns only those rows, [batch*n, hidden]: the
    same values as the full layer's rows there, for about n/seq of the layer's cost beyond
    the key and value projections. With `real_rows` (a `RealRows`; not with
    `query_positions`) `hidden` and the result hold only the real tokens' rows [n, hidden]."""
    query_hidden, query_length, residual = None, None, hidden
    if query_positions is not None:
        query_length = core.get_shape_list(query_positions, expected_rank=2)[1]
        width = hidden.shape[-1]
        residual = core.gather_indexes(tf.reshape(hidden, [batch, seq, width]),
                                       query_positions)         # [batch*query_length, width]
        query_hidden = residual
        attention_bias = select_query_bias(attention_bias, query_positions)
    with tf1.variable_scope("attention"):
        with tf1.variable_scope("self"):
            context = self_attention(hidden, attention_bias, batch, seq, config, is_training,
                                     compute_dtype, query_hidden, query_length, real_rows)
        with tf1.variable_scope("output"):
            attention_output = _output_projection(context, residual, config, is_training)
    with tf1.variable_scope("intermediate"):
        intermediate = core.dense(attention_output, config.intermediate_size, "dense",
                                  activation=get_activation(config.hidden_act),
                                  initializer_range=config.initializer_range,
                                  compute_dtype=compute_dtype)
    with tf1.variable_scope("output"):
        return _output_projection(intermediate, attention_output, config, is_training)


def transformer_encoder(embeddings, attention_bias, config, is_training, compute_dtype,
                        final_positions=None, real_rows=None):
    """Runs all layers.

    embeddings: [batch, seq, hidden] float32; attention_bias: [batch, 1, 1, seq] or
    [batch, 1, seq, seq] in `compute_dtype`. Returns the list of every layer's output, each
    [batch, seq, hidden] float32, except that with `final_positions` [batch, n] the last
    layer computes, and returns as [batch, n, hidden], only the rows at those positions:
    what heads that read only some positions (masked-LM, [CLS]) need. With `real_rows`
    (a `RealRows` of the padding mask) the layers compute only the real tokens' rows (the
    last one with `final_positions` works on the full layout); a padded position's output
    is then a copy of a real one of its sequence, not what it would compute.
    """
    batch, seq, width = core.get_shape_list(embeddings, expected_rank=3)
    if width != config.hidden_size:
        raise ValueError(f"embedding width {width} != hidden_size {config.hidden_size}")
    hidden = tf.reshape(embeddings, [-1, width])
    packed = real_rows is not None
    if packed:
        hidden = real_rows.pack(hidden)
    outputs = []
    for index in range(config.num_hidden_layers):
        last = index == config.num_hidden_layers - 1
        positions = final_positions if last else None
        if packed and positions is not None:  # its query rows are chosen by position
            hidden, packed = real_rows.pad(hidden), False
        with tf1.variable_scope(f"layer_{index}"):
            hidden = transformer_layer(hidden, attention_bias, batch, seq, config, is_training,
                                       compute_dtype, positions,
                                       real_rows if packed else None)
            rows = seq if positions is None else core.get_shape_list(positions)[1]
            full = real_rows.pad(hidden) if packed else hidden
            outputs.append(tf.reshape(full, [batch, rows, width]))
    return outputs
