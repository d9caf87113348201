"""Pre-training heads with Google's names: masked-LM (`cls/predictions`) and next sentence
(`cls/seq_relationship`).

The masked-LM decoder is tied to the word-embedding table (its transpose), with its own
output bias, exactly as in the released checkpoints. Losses are computed in float32.
"""
import tensorflow as tf

from modeling import core
from modeling.activations import get_activation

tf1 = tf.compat.v1


def masked_lm_output(config, input_tensor, embedding_table, positions, label_ids,
                     label_weights, compute_type=tf.float32):
    """Masked-LM head and loss.

    input_tensor: [batch, seq, hidden] (the sequence output), or [batch, max_predictions,
    hidden] already at the masked positions when `positions` is None (a `BertModel` built
    with `output_positions`); positions, label_ids, label_weights: [batch, max_predictions]
    (weights 1.0 for real predictions, 0 padding).
    Returns (loss scalar, per_example_loss [batch*n], log_probs [batch*n, vocab]).
    """
    compute_type = core.as_compute_dtype(compute_type)
    if positions is None:
        selected = tf.reshape(input_tensor, [-1, config.hidden_size])
    else:
        selected = core.gather_indexes(input_tensor, positions)
    selected = tf.cast(selected, compute_type)
    with tf1.variable_scope("cls/predictions"):
        with tf1.variable_scope("transform"):
            selected = core.dense(selected, config.hidden_size, "dense",
                                  activation=get_activation(config.hidden_act),
                                  initializer_range=config.initializer_range)
            selected = tf.cast(core.layer_norm(selected, epsilon=config.layer_norm_eps),
                               compute_type)
        output_bias = tf1.get_variable("output_bias", [config.vocab_size], tf.float32,
                                       tf1.zeros_initializer())
        logits = core.matmul(selected, tf.cast(embedding_table, compute_type), transpose_b=True)
        logits = tf.cast(logits, tf.float32) + output_bias
        log_probs = tf.nn.log_softmax(logits, axis=-1)

        label_ids = tf.reshape(label_ids, [-1])
        label_weights = tf.cast(tf.reshape(label_weights, [-1]), tf.float32)
        one_hot = tf.one_hot(label_ids, depth=config.vocab_size, dtype=tf.float32)
        per_example_loss = -tf.reduce_sum(log_probs * one_hot, axis=[-1])
        numerator = tf.reduce_sum(label_weights * per_example_loss)
        denominator = tf.reduce_sum(label_weights) + 1e-5
        loss = numerator / denominator
    return loss, per_example_loss, log_probs


def next_sentence_output(config, pooled_output, labels, label_weights=None):
    """Next-sentence head: pooled [n, hidden], labels [n] or [batch, k] (1 = random).

    label_weights: None (every row counts) or [n] / [batch, k] 1.0 for real instances and 0
    for empty slots of packed rows; the loss is then the mean over real instances only, so a
    packed batch has the same loss as the same instances unpacked.
    Returns (loss scalar, per_example_loss [n], log_probs [n, 2]).
    """
    with tf1.variable_scope("cls/seq_relationship"):
        weights = tf1.get_variable("output_weights", [2, config.hidden_size], tf.float32,
                                   core.create_initializer(config.initializer_range))
        bias = tf1.get_variable("output_bias", [2], tf.float32, tf1.zeros_initializer())
        logits = tf.nn.bias_add(tf.matmul(tf.cast(pooled_output, tf.float32), weights,
                                          transpose_b=True), bias)
        log_probs = tf.nn.log_softmax(logits, axis=-1)
        labels = tf.reshape(labels, [-1])
        one_hot = tf.one_hot(labels, depth=2, dtype=tf.float32)
        per_example_loss = -tf.reduce_sum(one_hot * log_probs, axis=-1)
        if label_weights is None:
            loss = tf.reduce_mean(per_example_loss)
        else:
            label_weights = tf.cast(tf.reshape(label_weights, [-1]), tf.float32)
            loss = tf.reduce_sum(label_weights * per_example_loss) / tf.maximum(
                tf.reduce_sum(label_weights), 1.0)
    return loss, per_example_loss, log_probs
