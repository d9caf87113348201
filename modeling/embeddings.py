"""The embedding block: word + token-type + position embeddings, layer norm, dropout.

Names (Google's): `embeddings/word_embeddings` [vocab, hidden],
`embeddings/token_type_embeddings` [type_vocab, hidden],
`embeddings/position_embeddings` [max_positions, hidden], `embeddings/LayerNorm/{beta,gamma}`.
Lookups gather from the float32 tables, which is far cheaper than casting a 30k x 768 table
to the compute dtype every step; the sum is normalised in float32.
"""
import tensorflow as tf

from modeling import core

tf1 = tf.compat.v1


def embedding_lookup(input_ids, vocab_size, embedding_size, initializer_range,
                     name="word_embeddings", use_one_hot_embeddings=False):
    """[batch, seq] int ids -> ([batch, seq, hidden] float32 embeddings, float32 table).

    `use_one_hot_embeddings` does the lookup as a one-hot matmul (faster on TPUs, kept for
    Google's signature); the default gather is better on GPUs and CPUs.
    """
    table = tf1.get_variable(name, [vocab_size, embedding_size], tf.float32,
                             core.create_initializer(initializer_range))
    if use_one_hot_embeddings:
        flat_ids = tf.reshape(input_ids, [-1])
        one_hot = tf.one_hot(flat_ids, depth=vocab_size)
        output = tf.reshape(tf.matmul(one_hot, table),
                            core.get_shape_list(input_ids) + [embedding_size])
    else:
        output = tf.gather(table, input_ids)
    return output, table


def embedding_postprocessor(word_embeddings, token_type_ids, config, is_training,
                            position_ids=None):
    """Adds token-type and position embeddings, normalises, drops out.

    word_embeddings: [batch, seq, hidden] float32; token_type_ids: [batch, seq] int;
    position_ids: [batch, seq] int or None (positions 0..seq-1). Packed rows pass positions
    that restart at 0 with each instance, so every instance is embedded as if it were alone.
    Returns [batch, seq, hidden] float32 (the encoder casts to the compute dtype per matmul).
    """
    _, seq_length, width = core.get_shape_list(word_embeddings, expected_rank=3)
    if isinstance(seq_length, int) and seq_length > config.max_position_embeddings:
        raise ValueError(f"sequence length {seq_length} exceeds max_position_embeddings "
                         f"{config.max_position_embeddings} of the BERT config")
    token_type_table = tf1.get_variable(
        "token_type_embeddings", [config.type_vocab_size, width], tf.float32,
        core.create_initializer(config.initializer_range))
    output = word_embeddings + tf.gather(token_type_table, token_type_ids)

    position_table = tf1.get_variable(
        "position_embeddings", [config.max_position_embeddings, width], tf.float32,
        core.create_initializer(config.initializer_range))
    if position_ids is None:
        positions = tf.slice(position_table, [0, 0], [seq_length, -1])  # [seq, hidden]
        output = output + tf.expand_dims(positions, 0)
    else:
        output = output + tf.gather(position_table, position_ids)   # [batch, seq, hidden]

    output = core.layer_norm(output, epsilon=config.layer_norm_eps)
    return core.dropout(output, config.hidden_dropout_prob, is_training)
