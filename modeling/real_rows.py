"""The real tokens' rows of a padded batch, for an encoder that computes only those.

A batch of requests is padded to its longest: SST-2 sentences in batches of 8 are 38%
padding, of 32 48%; SQuAD's windows in batches of 32 30%. Every dense layer (the query, key
and value projections, the attention output, the feed-forward pair; ~80% of a serving call)
works row by row, so a padded row is pure waste there. Only attention mixes rows, and only
within a sequence, so it alone needs the [batch, seq] layout back.

`RealRows` holds the gathers both ways: `pack` takes a [batch*seq, width] matrix to the real
rows [n, width] (n = the batch's real tokens), `pad` takes [n, width] back to [batch*seq,
width]. A padded position gets a copy of a real row of its sequence (the one before it):
attention masks its key and value out (`attention_bias_from_mask`: their weight underflows
to exactly 0 in float32), and what a padded query computes is dropped by the next `pack`.
Position 0 of every sequence (its [CLS], which the pooler reads) is kept even where the mask
says padding, so no sequence is left without a row.
"""
import tensorflow as tf


class RealRows:
    """The rows of `input_mask` [batch, seq] that hold tokens (plus each position 0)."""

    def __init__(self, input_mask):
        mask = tf.cast(input_mask, tf.int32)
        with_first = tf.concat([tf.ones_like(mask[:, :1]), mask[:, 1:]], axis=1)
        kept = tf.reshape(with_first, [-1])                                # [batch*seq] 0/1
        # [n]: where each real row sits in the padded matrix
        self.rows = tf.cast(tf.reshape(tf.where(kept > 0), [-1]), tf.int32)
        # [batch*seq]: the real row each position reads (a padded one: the last real before it)
        self.slots = tf.maximum(tf.cumsum(kept) - 1, 0)

    def pack(self, padded):
        """[batch*seq, width] -> [n, width], the real rows in order."""
        return tf.gather(padded, self.rows)

    def pad(self, packed):
        """[n, width] -> [batch*seq, width]; a padded position holds a real row's copy."""
        return tf.gather(packed, self.slots)
