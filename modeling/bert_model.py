"""`BertModel`: Google's BERT encoder, in graph mode, with a selectable compute dtype.

Usage inside an Estimator `model_fn` (or any tf.compat.v1 graph):

    config = BertConfig.from_json_file("bert_config.json")
    model = BertModel(config, is_training=True, input_ids=ids, input_mask=mask,
                      token_type_ids=segments, compute_type="bfloat16")
    pooled = model.get_pooled_output()                 # [batch, hidden], float32
    sequence = model.get_sequence_output()             # [batch, seq, hidden], float32

Variables live under `bert/` with Google's names, so `tf.compat.v1.train.init_from_checkpoint`
maps a released Google checkpoint one to one. Outputs are returned in float32 whatever the
compute dtype, so heads and losses downstream need no precision handling of their own.
"""
import tensorflow as tf

from modeling import core
from modeling.attention import attention_bias_from_instance_ids, attention_bias_from_mask
from modeling.embeddings import embedding_lookup, embedding_postprocessor
from modeling.real_rows import RealRows
from modeling.transformer import transformer_encoder

tf1 = tf.compat.v1


class PackedRows:
    """Where the instances of packed rows are (sequence packing, Krell et al. 2021).

    instance_ids: [batch, seq] int, 1..k for the tokens of a row's k instances, 0 padding;
    position_ids: [batch, seq] int, restarting at 0 at each instance's [CLS];
    cls_positions: [batch, max_instances] int, the [CLS] position of each instance slot
      (empty slots point at 0; their next-sentence weight is 0).
    """

    def __init__(self, instance_ids, position_ids, cls_positions):
        self.instance_ids = instance_ids
        self.position_ids = position_ids
        self.cls_positions = cls_positions


class BertModel:
    """BERT encoder: embeddings -> Transformer stack -> pooler.

    Args:
      config: `BertConfig`.
      is_training: enables dropout.
      input_ids: int32/int64 [batch, seq].
      input_mask: int [batch, seq], 1 for real tokens, 0 for padding (default: all 1).
      token_type_ids: int [batch, seq] segment ids (default: all 0).
      use_one_hot_embeddings: one-hot matmul lookup (TPU style) instead of gather.
      scope: variable scope, default "bert".
      compute_type: float32, float16 or bfloat16 (variables stay float32).
      packing: `PackedRows` when each row holds several instances (sequence packing), else
        None. Attention then stays inside each instance, positions restart with each
        instance, and the pooled output is one row per instance ([CLS] of each).
      output_positions: which positions of the sequence output the caller reads. None:
        all of them. An int tensor [batch, n]: only those (the masked-LM positions), and
        `get_sequence_output()` is then [batch, n, hidden]. `POOLED_ONLY`: none, only the
        pooled output (classification). The last layer then computes only those rows and
        the [CLS] rows the pooler reads (queries, output projection, feed-forward): the
        same values for about n/seq of that layer's cost, ~6% of a BERT-base
        pre-training step at seq 128 and ~14% of a 6-layer classifier's.
      skip_padding: the encoder's layers compute only the rows of real tokens
        (`modeling.real_rows`): a padded position's sequence output is then a copy of a
        real position's, not its own. For serving, where nothing reads padded positions
        (training's SQuAD loss takes a softmax over all of them). Not with `packing`.
    """

    POOLED_ONLY = "pooled_only"

    def __init__(self, config, is_training, input_ids, input_mask=None, token_type_ids=None,
                 use_one_hot_embeddings=False, scope=None, compute_type=tf.float32,
                 packing=None, output_positions=None, skip_padding=False):
        self.config = config
        self.compute_type = core.as_compute_dtype(compute_type)
        input_ids = tf.convert_to_tensor(input_ids)
        batch, seq = core.get_shape_list(input_ids, expected_rank=2, name="input_ids")
        if input_mask is None:
            input_mask = tf.ones([batch, seq], dtype=tf.int32)
        if token_type_ids is None:
            token_type_ids = tf.zeros([batch, seq], dtype=tf.int32)

        with tf1.variable_scope(scope, default_name="bert"):
            with tf1.variable_scope("embeddings"):
                word_embeddings, self.embedding_table = embedding_lookup(
                    input_ids, config.vocab_size, config.hidden_size, config.initializer_range,
                    use_one_hot_embeddings=use_one_hot_embeddings)
                self.embedding_output = embedding_postprocessor(
                    word_embeddings, token_type_ids, config, is_training,
                    position_ids=packing.position_ids if packing else None)

            cls_positions = (packing.cls_positions if packing
                             else tf.zeros([batch, 1], tf.int32))
            final_positions = None
            if output_positions is not None:
                read = (tf.zeros([batch, 0], tf.int32) if output_positions is self.POOLED_ONLY
                        else tf.cast(output_positions, tf.int32))
                final_positions = tf.concat([tf.cast(cls_positions, tf.int32), read], axis=1)
            with tf1.variable_scope("encoder"):
                bias = (attention_bias_from_instance_ids(packing.instance_ids, self.compute_type)
                        if packing else attention_bias_from_mask(input_mask, self.compute_type))
                if skip_padding and packing:
                    raise ValueError("skip_padding needs a padding mask, not packed rows")
                self.all_encoder_layers = transformer_encoder(
                    self.embedding_output, bias, config, is_training, self.compute_type,
                    final_positions, RealRows(input_mask) if skip_padding else None)
            last_layer = self.all_encoder_layers[-1]
            if final_positions is None:
                self.sequence_output = last_layer
                first_token = (core.gather_indexes(last_layer, cls_positions)
                               if packing else last_layer[:, 0, :])
            else:
                # The last layer holds the [CLS] rows first, then the requested positions.
                classes = cls_positions.shape[1]
                self.sequence_output = last_layer[:, classes:, :]
                first_token = tf.reshape(last_layer[:, :classes, :], [-1, config.hidden_size])

            with tf1.variable_scope("pooler"):
                # The pooler reads the [CLS] position: [batch, hidden] -> [batch, hidden]
                # ([batch*k, hidden] from each instance's [CLS] in packed rows).
                pooled = core.dense(first_token, config.hidden_size, "dense",
                                    activation=tf.tanh,
                                    initializer_range=config.initializer_range,
                                    compute_dtype=self.compute_type)
                self.pooled_output = tf.cast(pooled, tf.float32)

    def get_pooled_output(self):
        """[batch, hidden] float32: tanh(dense(first token)), for classification
        ([batch*k, hidden], one per instance slot, for packed rows)."""
        return self.pooled_output

    def get_sequence_output(self):
        """[batch, seq, hidden] float32: the last encoder layer ([batch, n, hidden] at
        `output_positions` when they were given)."""
        return self.sequence_output

    def get_all_encoder_layers(self):
        """List of num_hidden_layers tensors [batch, seq, hidden] float32 (with
        `output_positions`, the last one holds the [CLS] rows and those positions only)."""
        return self.all_encoder_layers

    def get_embedding_output(self):
        """[batch, seq, hidden] float32: embeddings after LayerNorm/dropout."""
        return self.embedding_output

    def get_embedding_table(self):
        """[vocab, hidden] float32 variable `bert/embeddings/word_embeddings`."""
        return self.embedding_table
