"""Fine-tuning heads with Google's variable names, so Google-format fine-tuned checkpoints
load: the classifier's `output_weights`/`output_bias` (top level, as in Google's
`run_classifier.py`) and SQuAD's `cls/squad/output_weights`/`output_bias`."""
import tensorflow as tf

from modeling import core

tf1 = tf.compat.v1


def classification_head(pooled_output, num_labels, is_training, initializer_range=0.02,
                        dropout_rate=0.1):
    """pooled [batch, hidden] -> logits [batch, num_labels] (float32).

    num_labels == 1 is regression (STS-B): the single logit is the predicted score.
    """
    hidden = pooled_output.shape[-1]
    weights = tf1.get_variable("output_weights", [num_labels, hidden], tf.float32,
                               core.create_initializer(initializer_range))
    bias = tf1.get_variable("output_bias", [num_labels], tf.float32, tf1.zeros_initializer())
    pooled = core.dropout(pooled_output, dropout_rate, is_training)
    return tf.nn.bias_add(tf.matmul(pooled, weights, transpose_b=True), bias)


def classification_loss(logits, labels, is_regression):
    """Mean cross-entropy (or squared error for regression), float32."""
    if is_regression:
        return tf.reduce_mean(tf.square(tf.squeeze(logits, -1) - tf.cast(labels, tf.float32)))
    log_probs = tf.nn.log_softmax(logits, axis=-1)
    one_hot = tf.one_hot(tf.cast(labels, tf.int32), depth=logits.shape[-1], dtype=tf.float32)
    return tf.reduce_mean(-tf.reduce_sum(one_hot * log_probs, axis=-1))


def squad_head(sequence_output, initializer_range=0.02):
    """sequence [batch, seq, hidden] -> (start_logits, end_logits), each [batch, seq]."""
    batch, seq, hidden = core.get_shape_list(sequence_output, expected_rank=3)
    weights = tf1.get_variable("cls/squad/output_weights", [2, hidden], tf.float32,
                               core.create_initializer(initializer_range))
    bias = tf1.get_variable("cls/squad/output_bias", [2], tf.float32, tf1.zeros_initializer())
    flat = tf.reshape(sequence_output, [batch * seq, hidden])
    logits = tf.nn.bias_add(tf.matmul(flat, weights, transpose_b=True), bias)
    logits = tf.transpose(tf.reshape(logits, [batch, seq, 2]), [2, 0, 1])
    return logits[0], logits[1]


def squad_loss(start_logits, end_logits, start_positions, end_positions):
    """Mean of the start and end cross-entropies over the sequence positions."""
    def position_loss(logits, positions):
        log_probs = tf.nn.log_softmax(logits, axis=-1)
        one_hot = tf.one_hot(tf.cast(positions, tf.int32), depth=tf.shape(logits)[1],
                             dtype=tf.float32)
        return -tf.reduce_mean(tf.reduce_sum(one_hot * log_probs, axis=-1))
    return (position_loss(start_logits, start_positions)
            + position_loss(end_logits, end_positions)) / 2.0
