"""Test helper: small pre-training TFRecords made from random ids, with Google's schema
(static masking) or unmasked for dynamic masking (`data_prep.instances.unmasked_instances`)."""
import numpy as np
import tensorflow as tf

CLS, SEP, MASK = 2, 3, 4


def _int64(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=list(map(int, values))))


def _random_row(rng, seq_length, vocab_size):
    """(ids, input_mask, segment_ids, split): [CLS] A [SEP] B [SEP] of random ids, the first
    [SEP] at `split`."""
    length = int(rng.integers(seq_length // 2, seq_length + 1))
    ids = np.zeros(seq_length, np.int64)
    ids[:length] = rng.integers(5, vocab_size, length)
    ids[0], ids[length - 1] = CLS, SEP
    mask = (np.arange(seq_length) < length).astype(np.int64)
    split = length // 2
    ids[split] = SEP
    segments = ((np.arange(seq_length) > split) & (mask == 1)).astype(np.int64)
    return ids, mask, segments, split


def _write(path, examples):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for feature in examples:
            writer.write(tf.train.Example(
                features=tf.train.Features(feature=feature)).SerializeToString())


def write_random_records(path, count, seq_length=16, predictions=3, vocab_size=101, seed=0):
    """`count` records: real tokens, [CLS]=2/[SEP]=3 markers, a few masked positions."""
    rng = np.random.default_rng(seed)

    def example():
        ids, mask, segments, split = _random_row(rng, seq_length, vocab_size)
        positions = np.sort(rng.choice(np.arange(1, split), size=min(predictions, split - 1),
                                       replace=False))
        labels = ids[positions].copy()
        ids[positions] = MASK
        pad = predictions - len(positions)
        return {
            "input_ids": _int64(ids), "input_mask": _int64(mask),
            "segment_ids": _int64(segments),
            "masked_lm_positions": _int64(np.pad(positions, (0, pad))),
            "masked_lm_ids": _int64(np.pad(labels, (0, pad))),
            "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(
                value=[1.0] * len(positions) + [0.0] * pad)),
            "next_sentence_labels": _int64([rng.integers(0, 2)]),
        }

    _write(path, (example() for _ in range(count)))


def write_random_unmasked_records(path, count, seq_length=16, vocab_size=101, seed=0):
    """`count` dynamic-masking records: like `write_random_records` unmasked, with random
    word starts (about one token in four continues a word) and masking_vocab
    [vocab_size, CLS, SEP, MASK]."""
    rng = np.random.default_rng(seed)

    def example():
        ids, mask, segments, _ = _random_row(rng, seq_length, vocab_size)
        maskable = (mask == 1) & (ids != CLS) & (ids != SEP)
        starts = maskable & (rng.random(seq_length) < 0.75)
        return {
            "input_ids": _int64(ids), "input_mask": _int64(mask),
            "segment_ids": _int64(segments),
            "next_sentence_labels": _int64([rng.integers(0, 2)]),
            "word_starts": _int64(starts), "masking_vocab": _int64([vocab_size, CLS, SEP, MASK]),
        }

    _write(path, (example() for _ in range(count)))


def rewrite_record(path, index, change):
    """Rewrites record `index` of `path` after `change(example)` edits it in place."""
    records = list(tf.compat.v1.io.tf_record_iterator(str(path)))
    example = tf.train.Example.FromString(records[index])
    change(example)
    records[index] = example.SerializeToString()
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)


def write_script_data(root, training_files, training_count, seq_length=128, predictions=20,
                      seed_base=0, vocab_size=101):
    """What the run scripts read for one phase under `root`: `training/` (`training_files`
    files of `training_count` static records, one file per rank where it matters), `test/`
    (one file of 8), and a tiny `bert_config.json` beside them. Returns `root`."""
    from modeling import named_config
    for split, files, count in (("training", training_files, training_count), ("test", 1, 8)):
        (root / split).mkdir(parents=True)
        for index in range(files):
            write_random_records(root / split / f"part-{index}.tfrecord", count, seq_length,
                                 predictions, vocab_size, seed=seed_base + index + count)
    named_config("tiny").replace(vocab_size=vocab_size).to_json_file(
        str(root / "bert_config.json"))
    return root


def write_both_phases(root):
    """Records of both phases' shapes (sequence 128 with 20 predictions, 512 with 80) under
    root/phase1 and root/phase2, two files each (one per rank), and a tiny BERT config at
    root/bert_config.json; returns root."""
    import shutil
    for phase, seq, predictions in ((1, 128, 20), (2, 512, 80)):
        write_script_data(root / f"phase{phase}", 2, 64, seq, predictions, seed_base=100 * phase)
    shutil.copy(root / "phase1" / "bert_config.json", root / "bert_config.json")
    return root


def with_both_phases(env, root):
    """`env` with the run scripts' TRAIN_DATA/EVAL_DATA of both phases at `root`'s records
    (write_both_phases); returns env."""
    for phase in (1, 2):
        env[f"TRAIN_DATA_PHASE{phase}"] = str(root / f"phase{phase}" / "training")
        env[f"EVAL_DATA_PHASE{phase}"] = str(root / f"phase{phase}" / "test")
    return env
