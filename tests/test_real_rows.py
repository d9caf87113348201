"""An encoder that computes only the real tokens' rows (`BertModel(skip_padding=True)`,
modeling/real_rows.py) answers what the padded encoder answers at every real position and
in the pooled output, with the same variables, while its dense layers see only those rows."""
import numpy as np
import pytest
import tensorflow as tf

from modeling import BertModel, named_config
from serving_models import summation_order_tolerance

tf1 = tf.compat.v1
LENGTHS = [9, 3, 1, 6]  # real tokens of each sequence, padded to 9
SEQ = max(LENGTHS)


def _batch():
    rng = np.random.default_rng(5)
    ids = rng.integers(5, 101, (len(LENGTHS), SEQ)).astype(np.int32)
    mask = (np.arange(SEQ)[None, :] < np.array(LENGTHS)[:, None]).astype(np.int32)
    segments = (rng.random((len(LENGTHS), SEQ)) < 0.5).astype(np.int32) * mask
    return ids * mask, mask, segments


def _run_both(mask, output_positions=None):
    """(padded model's outputs, skipping model's outputs, the skipping model's first
    attention-output GEMM result) on one set of random variables."""
    ids, _, segments = _batch()
    config = named_config("tiny").replace(vocab_size=101)
    with tf.Graph().as_default() as graph:
        tf1.set_random_seed(11)
        with tf1.variable_scope("", reuse=tf1.AUTO_REUSE):
            models = [BertModel(config, False, tf.constant(ids), tf.constant(mask),
                                tf.constant(segments), scope="bert",
                                output_positions=output_positions, skip_padding=skip)
                      for skip in (False, True)]
        skipping_scope = models[1].all_encoder_layers[0].name.split("/")[0]
        gemm = graph.get_tensor_by_name(
            f"{skipping_scope}/encoder/layer_0/attention/output/MatMul:0")
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            padded, skipping, rows = session.run(
                [[m.get_sequence_output(), m.get_pooled_output()] for m in models] + [gemm])
    return padded, skipping, rows


def test_real_positions_and_pooled_output_match_the_padded_encoder():
    _, mask, _ = _batch()
    (sequence, pooled), (sequence_skip, pooled_skip), rows = _run_both(mask)
    assert rows.shape[0] == sum(LENGTHS) < mask.size  # the dense layers saw the real rows
    for row, length in enumerate(LENGTHS):
        np.testing.assert_allclose(sequence_skip[row, :length], sequence[row, :length],
                                   rtol=0, atol=summation_order_tolerance(sequence),
                                   err_msg=f"row {row}")
    np.testing.assert_allclose(pooled_skip, pooled, rtol=0, atol=summation_order_tolerance(pooled))
    assert np.abs(pooled_skip - pooled).max() < np.abs(pooled).max()  # not both zero


def test_a_pooled_only_model_skips_padding_until_its_last_layer():
    _, mask, _ = _batch()
    (_, pooled), (_, pooled_skip), rows = _run_both(mask, BertModel.POOLED_ONLY)
    assert rows.shape[0] == sum(LENGTHS)
    np.testing.assert_allclose(pooled_skip, pooled, rtol=0, atol=summation_order_tolerance(pooled))


def test_a_sequence_whose_mask_is_all_padding_keeps_its_first_row():
    """Position 0 is always computed (the pooler reads it): a request with an empty mask
    (row 2, one token before) still gets a row and a finite answer instead of the batch
    failing on a sequence of no rows; the other requests' answers do not move."""
    _, mask, _ = _batch()
    mask[2] = 0
    (_, pooled), (sequence_skip, pooled_skip), rows = _run_both(mask)
    assert rows.shape[0] == sum(LENGTHS)  # row 2's position 0 kept
    others = [0, 1, 3]
    np.testing.assert_allclose(pooled_skip[others], pooled[others], rtol=0,
                               atol=summation_order_tolerance(pooled))
    assert np.isfinite(sequence_skip).all() and np.isfinite(pooled_skip).all()


def test_skip_padding_is_refused_with_packed_rows():
    from modeling.bert_model import PackedRows
    config = named_config("tiny").replace(vocab_size=101)
    with tf.Graph().as_default():
        packing = PackedRows(tf.ones([1, 4], tf.int32), tf.zeros([1, 4], tf.int32),
                             tf.zeros([1, 1], tf.int32))
        with pytest.raises(ValueError, match="skip_padding needs a padding mask"):
            BertModel(config, False, tf.ones([1, 4], tf.int32), packing=packing,
                      skip_padding=True)
