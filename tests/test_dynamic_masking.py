"""Dynamic masking (create_pretraining_data.py --masking=dynamic + the input pipeline's
masker) against our static masking, which tests/test_pretraining_data.py checks against
Google's algorithm: the same instances, the same counts, the same statistics; new masks per
epoch and rank, repeatable streams, start-up checks of the records against the flags,
bertPrep's dynamic folder, and run_pretraining on dynamic records (exact resume after kill -9:
tests/test_resume_position.py)."""
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from data_prep.instances.pretraining_data import create_pretraining_tfrecords
from data_prep.instances.pretraining_data_options import PretrainingDataOptions
from data_prep.instances.vocab_info import load_tokenizer
from modeling import named_config
from pretraining.dynamic_masking import DynamicMasking, stream_key, unmasked_feature_spec
from pretraining.input_pipeline import InputError, make_dataset
from pretraining.record_checks import check_input_files
from pretraining_records import write_random_records, write_random_unmasked_records
from test_pretraining_data import _book_docs, write_docs
from training.records import record_dataset

SEQ, PRED, DUPES = 128, 20, 10


def read_all(dataset):
    """Every batch of a finite dataset, concatenated: {feature: numpy array}."""
    batches = list(dataset.as_numpy_iterator())
    return {name: np.concatenate([batch[name] for batch in batches]) for name in batches[0]}


def originals(rows):
    """input_ids with the masked tokens put back."""
    ids = rows["input_ids"].copy()
    index = np.nonzero(rows["masked_lm_weights"] > 0)
    ids[index[0], rows["masked_lm_positions"][index]] = rows["masked_lm_ids"][index]
    return ids


def chosen_tokens(rows):
    """[n, SEQ] bool: the positions to predict."""
    chosen = np.zeros(rows["input_ids"].shape, bool)
    index = np.nonzero(rows["masked_lm_weights"] > 0)
    chosen[index[0], rows["masked_lm_positions"][index]] = True
    return chosen


def replacement_shares(rows, mask_id):
    """Counts of predicted tokens shown as [MASK], unchanged, other."""
    index = np.nonzero(rows["masked_lm_weights"] > 0)
    shown = rows["input_ids"][index[0], rows["masked_lm_positions"][index]]
    label = rows["masked_lm_ids"][index]
    masked, kept = shown == mask_id, (shown == label) & (shown != mask_id)
    return np.array([masked.sum(), kept.sum(), (~masked & ~kept).sum()])


def same_share(count_a, total_a, count_b, total_b, sigmas=4.5):
    """Whether two observed proportions agree within `sigmas` standard errors."""
    pooled = (count_a + count_b) / (total_a + total_b)
    error = np.sqrt(pooled * (1 - pooled) * (1 / total_a + 1 / total_b))
    return abs(count_a / total_a - count_b / total_b) <= sigmas * error


def relative_position_histogram(rows, bins=10):
    real = rows["input_mask"].sum(axis=1)
    index = np.nonzero(rows["masked_lm_weights"] > 0)
    relative = rows["masked_lm_positions"][index] / real[index[0]]
    return np.histogram(relative, bins=bins, range=(0, 1))[0]


def cut_words(rows, is_continuation, specials):
    """(words cut by the choice, continuation pieces chosen). Words from the vocabulary, not
    from the records: a "##" piece continues the word before it unless that is a special."""
    ids = originals(rows)
    chosen = chosen_tokens(rows)
    real = rows["input_mask"] > 0
    continues = real[:, 1:] & is_continuation[ids[:, 1:]] & ~np.isin(ids[:, :-1], specials)
    return (int((chosen[:, 1:] != chosen[:, :-1])[continues].sum()),
            int(chosen[:, 1:][continues].sum()))


def googles_count(rows, prob=0.15):
    """Google's num_to_predict, with Python's round."""
    return np.array([min(PRED, max(1, round(int(n) * prob)))
                     for n in rows["input_mask"].sum(axis=1)])


@pytest.fixture(scope="module")
def corpus(shared_data, minilm_vocab, tmp_path_factory):
    """Static (per token and whole-word) and dynamic records of Alice in Wonderland, same seed:
    the same instances, masked at creation or not."""
    folder = tmp_path_factory.mktemp("dynamic_masking")
    text = write_docs(_book_docs(os.path.join(shared_data, "books",
                                              "pg11_alice_in_wonderland.txt")),
                      str(folder / "alice.txt"))
    tokenizer = load_tokenizer(minilm_vocab)
    paths = {}
    for name, changes in (("static", {}), ("static_wwm", {"do_whole_word_mask": True}),
                          ("dynamic", {"masking": "dynamic"})):
        paths[name] = str(folder / f"{name}.tfrecord")
        options = PretrainingDataOptions(dupe_factor=DUPES, random_seed=3, **changes)
        create_pretraining_tfrecords(text, paths[name], tokenizer, options,
                                     log_instances=0)
    return {"paths": paths, "vocab": tokenizer.vocab, "folder": folder,
            "unmasked": read_all(record_dataset([paths["dynamic"]], 4096,
                                                unmasked_feature_spec(SEQ), False,
                                                drop_remainder=False))}


def read(path, masking=None, **options):
    """Records of one file in order (evaluation reading), masked by `masking` if dynamic."""
    return read_all(make_dataset([path], 256, SEQ, PRED, False, masking=masking,
                                 drop_remainder=False, **options))


def test_pipeline_masks_the_static_records_instances_alike(corpus):
    vocab = corpus["vocab"]
    static = read(corpus["paths"]["static"])
    dynamic = read(corpus["paths"]["dynamic"], DynamicMasking(PRED))
    n = len(static["input_ids"])
    assert n > 3000
    # exactly the features, dtypes and shapes the model_fn reads from static records
    assert {name: (value.dtype, value.shape) for name, value in dynamic.items()} == \
        {name: (value.dtype, value.shape) for name, value in static.items()}
    training = [make_dataset([corpus["paths"][kind]], 8, SEQ, PRED, True, masking=masking)
                for kind, masking in (("static", None), ("dynamic", DynamicMasking(PRED)))]
    assert training[0].element_spec == training[1].element_spec  # static shapes included
    # the same instances; the labels are the original tokens; nothing else changed
    np.testing.assert_array_equal(originals(dynamic), corpus["unmasked"]["input_ids"])
    np.testing.assert_array_equal(originals(static), corpus["unmasked"]["input_ids"])
    chosen = chosen_tokens(dynamic)
    assert (dynamic["input_ids"][~chosen] == corpus["unmasked"]["input_ids"][~chosen]).all()
    # Google's count, row for row
    count = dynamic["masked_lm_weights"].sum(axis=1)
    np.testing.assert_array_equal(count, googles_count(dynamic))
    np.testing.assert_array_equal(count, static["masked_lm_weights"].sum(axis=1))
    # never [CLS], [SEP] or padding; ascending; padded with position 0, id 0, weight 0
    predicted = dynamic["masked_lm_weights"] > 0
    assert not np.isin(originals(dynamic)[chosen], [vocab["[CLS]"], vocab["[SEP]"]]).any()
    assert (dynamic["input_mask"][chosen] == 1).all() and not chosen[:, 0].any()
    assert (np.diff(dynamic["masked_lm_positions"], axis=1)[predicted[:, 1:]] > 0).all()
    assert (dynamic["masked_lm_positions"][~predicted] == 0).all()
    assert (dynamic["masked_lm_ids"][~predicted] == 0).all()
    # 80 % [MASK], 10 % unchanged, 10 % random, as in the static records
    shares_static = replacement_shares(static, vocab["[MASK]"])
    shares_dynamic = replacement_shares(dynamic, vocab["[MASK]"])
    total = shares_dynamic.sum()
    assert abs(shares_dynamic[0] / total - 0.8) < 0.02, shares_dynamic / total
    for a, b in zip(shares_static, shares_dynamic):
        assert same_share(a, shares_static.sum(), b, total), (shares_static, shares_dynamic)
    # random replacements: uniform over the vocabulary in both
    def others(rows):
        index = np.nonzero(rows["masked_lm_weights"] > 0)
        shown = rows["input_ids"][index[0], rows["masked_lm_positions"][index]]
        return shown[(shown != vocab["[MASK]"]) & (shown != rows["masked_lm_ids"][index])]
    other_static, other_dynamic = others(static), others(dynamic)
    spread = len(vocab) / np.sqrt(12)
    assert abs(other_static.mean() - other_dynamic.mean()) < 4.5 * spread * np.sqrt(
        1 / len(other_static) + 1 / len(other_dynamic))
    assert other_dynamic.max() > 0.9 * len(vocab) and other_dynamic.min() < 0.1 * len(vocab)
    # where in the sequence: the same distribution (chi-square homogeneity test of 10
    # relative-position bins, 9 degrees of freedom: 27.88 is its 0.1 % critical value)
    hist_static = relative_position_histogram(static)
    hist_dynamic = relative_position_histogram(dynamic)
    expected = np.outer([hist_static.sum(), hist_dynamic.sum()],
                        (hist_static + hist_dynamic) / (hist_static.sum() + hist_dynamic.sum()))
    chi2 = (((np.stack([hist_static, hist_dynamic]) - expected) ** 2) / expected).sum()
    assert chi2 < 27.88, (hist_static, hist_dynamic)


def test_whole_word_masking_never_cuts_a_word(corpus):
    vocab = corpus["vocab"]
    is_continuation = np.zeros(len(vocab), bool)
    is_continuation[[i for token, i in vocab.items() if token.startswith("##")]] = True
    specials = [vocab["[CLS]"], vocab["[SEP]"]]
    static = read(corpus["paths"]["static_wwm"])
    dynamic = read(corpus["paths"]["dynamic"], DynamicMasking(PRED, whole_word=True))
    tokens = read(corpus["paths"]["dynamic"], DynamicMasking(PRED))
    cut, continuations = cut_words(dynamic, is_continuation, specials)
    assert cut == 0 and continuations > 50
    assert cut_words(tokens, is_continuation, specials)[0] > 50  # the check can fail
    # Google's count rule: never above the count, full rows as often as in static records
    count = dynamic["masked_lm_weights"].sum(axis=1)
    assert (count <= googles_count(dynamic)).all()
    full = [(rows["masked_lm_weights"].sum(axis=1) == googles_count(rows)).sum()
            for rows in (static, dynamic)]
    assert same_share(full[0], len(count), full[1], len(count)), full
    pieces = [cut_words(rows, is_continuation, specials)[1] for rows in (static, dynamic)]
    chosen = [rows["masked_lm_weights"].sum() for rows in (static, dynamic)]
    assert same_share(pieces[0], chosen[0], pieces[1], chosen[1]), (pieces, chosen)


def test_masks_change_with_epoch_and_rank_and_repeat_exactly(corpus):
    path, masking, batch = corpus["paths"]["dynamic"], DynamicMasking(PRED), 64
    instances = len(corpus["unmasked"]["input_ids"])

    def stream(batches, **options):
        dataset = make_dataset([path], batch, SEQ, PRED, True, masking=masking, seed=5,
                               shuffle_buffer=100, **options)
        return list(dataset.take(batches).as_numpy_iterator())

    two_epochs = stream(2 * instances // batch)
    seen = {}
    for rows in two_epochs:
        for key, positions in zip(map(bytes, originals(rows)), map(tuple, chosen_tokens(rows))):
            seen.setdefault(key, []).append(positions)
    again = [masks for masks in seen.values() if len(masks) >= 2]
    assert len(again) > 0.8 * instances
    differ = np.mean([masks[0] != masks[1] for masks in again])
    assert differ > 0.9, differ
    # the same settings give the same stream; skipping whole micro-batches (the resume
    # fallback) continues it exactly, masks included
    skipped = stream(4, skip_records=6 * batch)
    for expected, got in zip(two_epochs[6:10], skipped):
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    for expected, got in zip(two_epochs[:3], stream(3)):
        np.testing.assert_array_equal(got["input_ids"], expected["input_ids"])
    # another rank masks the same micro-batch differently
    unmasked = next(iter(record_dataset([path], batch, unmasked_feature_spec(SEQ), False)))
    by_rank = [masking.batch_fn(stream_key(5, rank, "train"))(tf.constant(0, tf.int64),
                                                               unmasked)
               for rank in (0, 1)]
    assert (by_rank[0]["masked_lm_positions"].numpy() !=
            by_rank[1]["masked_lm_positions"].numpy()).any(axis=1).mean() > 0.9
    # evaluation: the same masks every time, whatever --seed
    first, second = read(path, masking), read(path, masking, seed=99)
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)


def check_records_match(files, seq, predictions, vocab_size, dynamic_flags=()):
    """The start-up check of run_pretraining for a model of `vocab_size`: the shared facts."""
    config = named_config("tiny").replace(vocab_size=vocab_size)
    return check_input_files(files, seq, predictions, config, dynamic_flags)[0]


def test_start_up_checks_name_the_file_and_the_problem(tmp_path, repo_root):
    def folder(name, *writers):
        path = tmp_path / name
        path.mkdir()
        for index, write in enumerate(writers):
            write(path / f"part-{index}.tfrecord", index)
        return sorted(str(p) for p in path.iterdir())

    def static(path, seed):
        write_random_records(path, 4, 16, 3, 101, seed=seed)

    def dynamic(vocab_size=101, seq=16):
        return lambda path, seed: write_random_unmasked_records(path, 4, seq, vocab_size, seed)

    assert check_records_match(folder("dynamic", dynamic(), dynamic()), 16, 5, 101).kind == \
        "dynamic"
    assert check_records_match(folder("static", static, static), 16, 3, 101).kind == "static"
    mixed = folder("mixed", static, dynamic())
    with pytest.raises(InputError) as error:
        check_records_match(mixed, 16, 3, 101)
    assert str(error.value) == (f"{mixed[1]}: dynamic-masking (unmasked) records, but "
                                f"{mixed[0]} holds static (masked) records; use one kind per run")
    with pytest.raises(InputError) as error:
        check_records_match(folder("static2", static), 16, 3, 101, ["--masked_lm_prob=0.2"])
    assert str(error.value).endswith(
        "part-0.tfrecord: static (masked) records are masked already; --masked_lm_prob=0.2 "
        "applies only to records written with create_pretraining_data.py --masking=dynamic")
    vocabularies = folder("vocabularies", dynamic(), dynamic(vocab_size=30522))
    with pytest.raises(InputError) as error:
        check_records_match(vocabularies, 16, 3, 30522)
    assert str(error.value) == (f"{vocabularies[1]}: written with another vocabulary than "
                                f"{vocabularies[0]} (masking_vocab [30522, 2, 3, 4] vs "
                                "[101, 2, 3, 4])")
    large = folder("large", dynamic(vocab_size=30522))
    with pytest.raises(InputError, match=r"part-0\.tfrecord: records made with a vocabulary "
                                         r"of 30522 tokens, more than the vocab_size 101 of "
                                         r".*bert_tiny_config\.json: token ids from 101 up"):
        check_records_match(large, 16, 3, 101)
    longer = folder("longer", dynamic(), dynamic(seq=32))
    with pytest.raises(InputError, match=r"part-1\.tfrecord: records have sequence length 32 "
                                         r"but --max_seq_length=16$"):
        check_records_match(longer, 16, 3, 101)
    # on the command lines: one line, no traceback
    result = subprocess.run(
        [sys.executable, "create_pretraining_data.py", f"--input_file={__file__}",
         f"--output_file={tmp_path / 'out.tfrecord'}", f"--vocab_file={__file__}",
         "--masking=dynamic", "--do_whole_word_mask"],
        cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --do_whole_word_mask: dynamic-masking records keep every word start; choose "
        "whole-word masking when training (run_pretraining.py --do_whole_word_mask)")


def test_run_pretraining_trains_and_evaluates_dynamic_records_repeatably(tmp_path, repo_root):
    from test_pretraining import PREDICTIONS, SEQ as SHORT, VOCAB, command_line, make_flags
    from pretraining.runner import run
    data = tmp_path / "data"
    for part in ("train", "eval"):
        (data / part).mkdir(parents=True)
    for index in range(2):
        write_random_unmasked_records(data / "train" / f"part-{index}.tfrecord", 24, SHORT,
                                      VOCAB, seed=index)
    write_random_unmasked_records(data / "eval" / "part-0.tfrecord", 20, SHORT, VOCAB, seed=5)
    from modeling import named_config
    named_config("tiny").replace(vocab_size=VOCAB).to_json_file(str(data / "bert_config.json"))
    flags = dict(num_train_steps=2, do_eval=True, eval_batch_size=8, max_eval_steps=3,
                 do_whole_word_mask=True, masked_lm_prob=0.3)
    first = run(make_flags(data, tmp_path / "run", **flags))
    assert first["train"]["final_step"] == 2 and np.isfinite(first["train"]["total_loss"])
    again = run(make_flags(data, tmp_path / "run", **dict(flags, do_train=False, seed=3)))
    assert again["eval"] == first["eval"]
    assert 0 < first["eval"]["masked_lm_loss"] < 20
    # static records refuse the dynamic-only flags, in one line
    static = tmp_path / "static"
    static.mkdir()
    write_random_records(static / "part-0.tfrecord", 8, SHORT, PREDICTIONS, VOCAB)
    result = subprocess.run(command_line(data, tmp_path / "refused", input_files_dir=str(static))
                            + ["--do_whole_word_mask"], cwd=repo_root, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {static / 'part-0.tfrecord'}: static (masked) records are masked already; "
        "--do_whole_word_mask=True applies only to records written with "
        "create_pretraining_data.py --masking=dynamic")


def test_bertprep_writes_dynamic_records_into_their_own_folder(corpus, minilm_vocab):
    from data_prep.bertprep import prep_actions
    from data_prep.bertprep.prep_layout import PrepOptions
    work = corpus["folder"] / "bertprep"
    shards = work / "sharded_training_shards_1_test_shards_0_fraction_0.1" / "custom"
    shards.mkdir(parents=True)
    (shards / "custom_training_0.txt").write_bytes((corpus["folder"] / "alice.txt").read_bytes())
    options = PrepOptions(
        action="create_tfrecord_files", dataset="custom", working_dir=str(work),
        n_training_shards=1, n_test_shards=0, vocab_file=minilm_vocab, max_seq_length=SEQ,
        dupe_factor=1, masking="dynamic", n_processes=1)
    assert prep_actions.run(options) == 0
    written = work / "tfrecord_lower_case_1_seq_len_128_random_seed_12345_dupe_factor_1_dynamic"
    files = [str(written / "custom" / "training" / "custom_training_0.tfrecord")]
    assert check_records_match(files, SEQ, PRED, len(corpus["vocab"])).kind == "dynamic"


@pytest.mark.long
@pytest.mark.horovod
def test_two_horovod_ranks_draw_their_own_masks_repeatably(tmp_path, repo_root):
    """Two ranks over Gloo read identical files (a record and its copy, same shuffle), with
    dropout off: their gradients differ only where their masks do. Static records are the
    control: two ranks averaging the same gradient equal one rank at twice the per-rank
    learning rate, bit for bit. Dynamic records must break that equality (each rank masks
    from its own stream), and a repeat of the two-rank run gives the same weights."""
    pytest.importorskip("horovod.tensorflow", reason="Horovod not installed "
                        "(bash scripts/install.sh builds it)")
    from kill_support import assert_same_weights
    from test_pretraining import PREDICTIONS, SEQ as SHORT, VOCAB, checkpoint_tensors, \
        command_line
    horovodrun = [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "-np", "2",
                  "--gloo", "-H", "localhost:2"]
    data = tmp_path / "data"
    data.mkdir()
    named_config("tiny").replace(vocab_size=VOCAB, hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0).to_json_file(
        str(data / "bert_config.json"))
    writers = {"static": lambda path: write_random_records(path, 32, SHORT, PREDICTIONS, VOCAB),
               "dynamic": lambda path: write_random_unmasked_records(path, 32, SHORT, VOCAB)}
    for kind, write in writers.items():
        for ranks in (1, 2):
            folder = data / f"{kind}_{ranks}"
            folder.mkdir()
            write(folder / "part-0.tfrecord")
            if ranks == 2:  # rank 1 reads a copy of rank 0's file
                (folder / "part-1.tfrecord").write_bytes((folder / "part-0.tfrecord").read_bytes())

    def train(kind, ranks, output):
        settings = dict(num_train_steps=3, input_files_dir=str(data / f"{kind}_{ranks}"),
                        learning_rate=1e-3 * (2 if ranks == 1 else 1))  # per rank x ranks
        args = command_line(data, tmp_path / output, **settings)
        if ranks == 2:
            args = horovodrun + args + ["--horovod"]
        result = subprocess.run(args, cwd=repo_root, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        return tmp_path / output / "model.ckpt-3"

    assert_same_weights(train("static", 1, "static_1"), train("static", 2, "static_2"))
    one, two = train("dynamic", 1, "dynamic_1"), train("dynamic", 2, "dynamic_2")
    one, two = checkpoint_tensors(str(one)), checkpoint_tensors(str(two))
    kernel = "bert/encoder/layer_0/attention/self/query/kernel"
    assert not np.array_equal(one[kernel], two[kernel]), "both ranks drew the same masks"
    np.testing.assert_allclose(one[kernel], two[kernel], atol=0.05)  # same model, other masks
    assert_same_weights(tmp_path / "dynamic_2" / "model.ckpt-3",
                        train("dynamic", 2, "dynamic_2_again"))
