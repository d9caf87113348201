"""Sequence packing: the packing itself (constraints, determinism) and the correctness oracle
of the issue: a packed batch gives the same per-instance masked-LM and next-sentence losses
and the same gradients as the same instances unpacked (float32, <= 1e-5)."""
import types

import numpy as np
import pytest
import tensorflow as tf

from data_prep.instances.packing import best_fit_decreasing, pack_features, padding_fraction
from modeling import named_config
from pretraining.model_fn import pretraining_losses

tf1 = tf.compat.v1
SEQ, PREDICTIONS, VOCAB, PER_ROW = 32, 6, 97, 3


def random_instances(count, rng):
    """Google-shaped unpacked instances of random lengths: [CLS] A [SEP] B [SEP], padding,
    masked-LM predictions inside A/B (at most round(0.15 * length), at least 1)."""
    lengths = rng.integers(6, SEQ + 1, size=count)
    lengths[: count // 2] = rng.integers(6, 14, size=count // 2)   # many short ones
    features = {name: np.zeros((count, SEQ), np.int32)
                for name in ("input_ids", "input_mask", "segment_ids")}
    for name in ("masked_lm_positions", "masked_lm_ids"):
        features[name] = np.zeros((count, PREDICTIONS), np.int32)
    features["masked_lm_weights"] = np.zeros((count, PREDICTIONS), np.float32)
    features["next_sentence_labels"] = rng.integers(0, 2, size=(count, 1)).astype(np.int32)
    for i, length in enumerate(lengths):
        a_len = int(rng.integers(1, length - 3))
        features["input_ids"][i, :length] = rng.integers(5, VOCAB, size=length)
        features["input_ids"][i, [0, a_len + 1, length - 1]] = [2, 3, 3]
        features["input_mask"][i, :length] = 1
        features["segment_ids"][i, a_len + 2:length] = 1
        candidates = [p for p in range(1, length - 1) if p != a_len + 1]
        count_i = min(PREDICTIONS, max(1, round(0.15 * length)), len(candidates))
        positions = np.sort(rng.choice(candidates, size=count_i, replace=False))
        features["masked_lm_positions"][i, :count_i] = positions
        features["masked_lm_ids"][i, :count_i] = rng.integers(5, VOCAB, size=count_i)
        features["masked_lm_weights"][i, :count_i] = 1.0
    return features


@pytest.fixture(scope="module")
def instances():
    return random_instances(24, np.random.default_rng(7))


def test_rows_respect_every_bound_and_use_each_instance_once(instances):
    lengths = instances["input_mask"].sum(axis=1)
    predictions = (instances["masked_lm_weights"] > 0).sum(axis=1)
    rows = best_fit_decreasing(lengths, SEQ, PER_ROW, predictions, PREDICTIONS)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    for row in rows:
        assert 1 <= len(row) <= PER_ROW
        assert lengths[row].sum() <= SEQ and predictions[row].sum() <= PREDICTIONS
    assert len(rows) < len(lengths)            # something was packed
    assert rows == best_fit_decreasing(lengths, SEQ, PER_ROW, predictions, PREDICTIONS)
    # Best fit: no two rows could be merged into one (a first-fit bound of the greedy rule).
    loads = sorted((lengths[row].sum(), len(row), predictions[row].sum()) for row in rows)
    smallest, second = loads[0], loads[1]
    assert (smallest[0] + second[0] > SEQ or smallest[1] + second[1] > PER_ROW
            or smallest[2] + second[2] > PREDICTIONS)


def test_packed_rows_keep_each_instance_unchanged(instances):
    rows = best_fit_decreasing(instances["input_mask"].sum(axis=1), SEQ, PER_ROW,
                               (instances["masked_lm_weights"] > 0).sum(axis=1), PREDICTIONS)
    packed = pack_features(instances, rows, PER_ROW)
    assert padding_fraction(packed["input_mask"]) < padding_fraction(instances["input_mask"])
    for r, members in enumerate(rows):
        for slot, i in enumerate(members):
            where = packed["instance_ids"][r] == slot + 1
            length = int(instances["input_mask"][i].sum())
            np.testing.assert_array_equal(packed["input_ids"][r][where],
                                          instances["input_ids"][i, :length])
            np.testing.assert_array_equal(packed["position_ids"][r][where], np.arange(length))
            start = packed["next_sentence_positions"][r, slot]
            assert packed["input_ids"][r, start] == 2 and where[start]
            assert packed["next_sentence_labels"][r, slot] == \
                instances["next_sentence_labels"][i, 0]
        assert packed["next_sentence_weights"][r].sum() == len(members)
        # every prediction points at a token of one of the row's instances
        real = packed["masked_lm_weights"][r] > 0
        assert np.all(packed["instance_ids"][r][packed["masked_lm_positions"][r][real]] > 0)


def _losses_and_gradients(features, config, weights=None):
    """Runs the pre-training losses and their gradients on `features` in a fresh graph,
    with the variables set to `weights` (name -> value; random when None).
    Returns (outputs, gradients in variable-name order, the weights used)."""
    settings = types.SimpleNamespace(bert_config=config, compute_type=tf.float32)
    with tf.Graph().as_default():
        tf1.set_random_seed(3)
        outputs = pretraining_losses(settings, {k: tf.constant(v) for k, v in features.items()},
                                     is_training=False)
        variables = sorted(tf1.trainable_variables(), key=lambda v: v.name)
        gradients = [tf.convert_to_tensor(g) for g in
                     tf.gradients(outputs["total_loss"], variables)]
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            for variable in variables if weights else ():
                variable.load(weights[variable.name], session)  # same start for both
            values = session.run({v.name: v for v in variables})
            outputs, gradients = session.run((outputs, gradients))
    return outputs, gradients, values


def test_packed_batch_trains_exactly_like_the_unpacked_one(instances):
    config = named_config("tiny").replace(vocab_size=VOCAB, max_position_embeddings=SEQ)
    lengths = instances["input_mask"].sum(axis=1)
    predictions = (instances["masked_lm_weights"] > 0).sum(axis=1)
    rows = best_fit_decreasing(lengths, SEQ, PER_ROW, predictions, PREDICTIONS)
    packed = pack_features(instances, rows, PER_ROW)
    plain, plain_grads, weights = _losses_and_gradients(instances, config)
    pack, pack_grads, _ = _losses_and_gradients(packed, config, weights)
    assert len(plain_grads) == len(pack_grads) > 10
    for key in ("total_loss", "masked_lm_loss", "next_sentence_loss"):
        np.testing.assert_allclose(pack[key], plain[key], rtol=1e-5, atol=1e-6)
    for grad_plain, grad_pack in zip(plain_grads, pack_grads):
        np.testing.assert_allclose(grad_pack, grad_plain, rtol=1e-4, atol=1e-6)
        assert np.abs(grad_pack - grad_plain).max() <= 1e-5
    # per instance: its next-sentence loss and each of its masked-LM losses
    mlm_plain = plain["mlm_example_loss"].reshape(len(lengths), PREDICTIONS)
    mlm_pack = pack["mlm_example_loss"].reshape(len(rows), PREDICTIONS)
    nsp_pack = pack["nsp_example_loss"].reshape(len(rows), PER_ROW)
    for r, members in enumerate(rows):
        first = 0
        for slot, i in enumerate(members):
            np.testing.assert_allclose(nsp_pack[r, slot], plain["nsp_example_loss"][i],
                                       rtol=1e-5, atol=1e-6)
            count = int(predictions[i])
            np.testing.assert_allclose(mlm_pack[r, first:first + count],
                                       mlm_plain[i, :count], rtol=1e-5, atol=1e-6)
            first += count


# --------------------------------------------------------------- written records, training

WRITTEN_SEQ = 64


@pytest.fixture(scope="module")
def written(shared_data, minilm_vocab, tmp_path_factory):
    """Records of Alice in Wonderland, one seed, unpacked and packed, static and dynamic."""
    import os
    from data_prep.instances.pretraining_data import create_pretraining_tfrecords
    from data_prep.instances.pretraining_data_options import PretrainingDataOptions
    from data_prep.instances.vocab_info import load_tokenizer
    from test_pretraining_data import _book_docs, write_docs
    folder = tmp_path_factory.mktemp("packing")
    text = write_docs(_book_docs(os.path.join(shared_data, "books",
                                              "pg11_alice_in_wonderland.txt")),
                      str(folder / "alice.txt"))
    tokenizer = load_tokenizer(minilm_vocab)
    paths, stats = {}, {}
    for masking in ("static", "dynamic"):
        for per_row in (0, PER_ROW):
            name = f"{masking}_{per_row}"
            (folder / name).mkdir()
            paths[name] = [str(folder / name / f"part-{i}.tfrecord") for i in range(2)]
            options = PretrainingDataOptions(
                max_seq_length=WRITTEN_SEQ, max_predictions_per_seq=10, dupe_factor=1,
                random_seed=5, masking=masking, max_sequences_per_row=per_row)
            stats[name] = create_pretraining_tfrecords(text, paths[name], tokenizer,
                                                       options, log_instances=0)
    return {"paths": paths, "stats": stats, "vocab_size": len(tokenizer.vocab),
            "folder": folder}


def _rows(paths):
    from data_prep.instances.tfrecord_writer import read_tfrecord_file
    rows = []
    for path in paths:
        for record in read_tfrecord_file(path):
            features = tf.train.Example.FromString(record).features.feature
            rows.append({name: np.array(value.int64_list.value or value.float_list.value)
                         for name, value in features.items()})
    return rows


def _instances(rows):
    """Each instance as (tokens, segments, next-sentence label, masked positions relative to
    its [CLS], masked ids), from unpacked or packed rows; sorted."""
    found = []
    for row in rows:
        ids = row.get("instance_ids", row["input_mask"])
        slots = int(ids.max())
        predictions = row.get("masked_lm_positions", np.zeros(0, int))
        real = row.get("masked_lm_weights", np.zeros(0)) > 0
        for slot in range(1, slots + 1):
            where = np.nonzero(ids == slot)[0]
            start, end = where[0], where[-1] + 1
            mine = real & (predictions >= start) & (predictions < end)
            label = row["next_sentence_labels"][slot - 1]
            found.append((tuple(row["input_ids"][start:end]), tuple(row["segment_ids"][start:end]),
                          int(label), tuple(predictions[mine] - start),
                          tuple(row["masked_lm_ids"][mine]) if "masked_lm_ids" in row else ()))
    return sorted(found)


@pytest.mark.parametrize("masking", ["static", "dynamic"])
def test_writer_packs_the_same_instances_with_less_padding(written, masking):
    plain, packed = (_rows(written["paths"][f"{masking}_{k}"]) for k in (0, PER_ROW))
    assert len(packed) < len(plain)
    assert _instances(packed) == _instances(plain)
    assert all(len(row["next_sentence_weights"]) == PER_ROW for row in packed)
    stats = written["stats"]
    assert stats[f"{masking}_{PER_ROW}"].padding_share < stats[f"{masking}_0"].padding_share / 2
    assert stats[f"{masking}_{PER_ROW}"].instances == stats[f"{masking}_0"].instances


def test_run_pretraining_trains_and_evaluates_packed_dynamic_records(written, tmp_path):
    from test_pretraining import make_flags
    from pretraining.runner import run
    data = tmp_path / "data"
    data.mkdir()
    named_config("tiny").replace(vocab_size=written["vocab_size"]).to_json_file(
        str(data / "bert_config.json"))
    folder = str(written["folder"] / f"dynamic_{PER_ROW}")
    flags = make_flags(data, tmp_path / "run", input_files_dir=folder, eval_files_dir=folder,
                       max_seq_length=WRITTEN_SEQ, max_predictions_per_seq=10,
                       num_train_steps=2, do_eval=True, eval_batch_size=8, max_eval_steps=2)
    result = run(flags)
    assert result["train"]["final_step"] == 2 and np.isfinite(result["train"]["total_loss"])
    assert 0 < result["eval"]["next_sentence_accuracy"] <= 1
    assert 0 < result["eval"]["masked_lm_loss"] < 20


def test_training_log_counts_the_instances_and_real_tokens_of_packed_rows(tmp_path):
    """Rows of exactly three 10-token instances: the log's sequences/s must be 3x its rows/s
    and its real tokens/s 30x (the same measured interval)."""
    from data_prep.instances.masked_instances import FEATURE_KINDS
    from data_prep.instances.packing import packed_kinds
    from data_prep.instances.tfrecord_writer import encode_tfrecords
    from pretraining.runner import run
    from test_pretraining import make_flags
    features = random_instances(400, np.random.default_rng(3))
    ten = np.nonzero(features["input_mask"].sum(axis=1) == 10)[0][:24]
    assert len(ten) == 24
    rows = [ten[i:i + PER_ROW].tolist() for i in range(0, 24, PER_ROW)]
    packed = pack_features(features, rows, PER_ROW)
    data = tmp_path / "data"
    (data / "train").mkdir(parents=True)
    (data / "train" / "part-0.tfrecord").write_bytes(
        encode_tfrecords(packed, packed_kinds(FEATURE_KINDS)).tobytes())
    named_config("tiny").replace(vocab_size=VOCAB).to_json_file(str(data / "bert_config.json"))
    train = run(make_flags(data, tmp_path / "run", max_seq_length=SEQ,
                           max_predictions_per_seq=PREDICTIONS, num_train_steps=3))["train"]
    assert train["average_sequences_per_second"] == pytest.approx(
        PER_ROW * train["average_rows_per_second"], rel=1e-9)
    assert train["average_real_tokens_per_second"] == pytest.approx(
        PER_ROW * 10 * train["average_rows_per_second"], rel=1e-9)


class _Clock:
    """time.time for `training.hooks`: advanced by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _logged(monkeypatch, micro_batches, ranks=2, batch=4):
    """The StepLoggingHook's records and summary after `micro_batches` ((seconds, values)
    each; two optimizer steps of two micro-batches) with `ranks` of `batch` rows."""
    from training import hooks
    clock = _Clock()
    monkeypatch.setattr(hooks.time, "time", clock)
    hook = hooks.StepLoggingHook({}, 1, batch * ranks, flops_per_sequence=1e12,
                                 warmup_logs=0, warmup_steps=0, is_chief=False, ranks=ranks)
    hook.begin()
    for number, (seconds, values) in enumerate(micro_batches):
        hook.before_run(None)
        clock.now += seconds
        step = (number + 1) // 2
        hook.after_run(None, types.SimpleNamespace(results=dict(
            values, global_step=step, is_optimizer_step=number % 2 == 1, total_loss=1.0)))
    return hook.records, hook.summary()


def test_step_log_counts_instances_and_real_tokens_of_packed_rows(monkeypatch):
    packed = [(1.0, {"instances": 9, "real_tokens": 100}),
              (1.0, {"instances": 11, "real_tokens": 120}),
              (2.0, {"instances": 4, "real_tokens": 60}),
              (2.0, {"instances": 4, "real_tokens": 60})]
    records, summary = _logged(monkeypatch, packed)
    # step 1: 2 micro-batches x 4 rows x 2 ranks = 16 rows, (9 + 11) x 2 instances in 2 s
    assert records[0]["rows_per_second"] == 8.0
    assert records[0]["sequences_per_second"] == 20.0
    assert records[0]["real_tokens_per_second"] == 220.0
    assert records[0]["tflops"] == 8.0  # a row costs the same however many instances it has
    assert records[1]["sequences_per_second"] == 4.0 and records[1]["rows_per_second"] == 4.0
    assert summary["average_sequences_per_second"] == (40 + 16) / 6
    assert summary["average_rows_per_second"] == 32 / 6
    assert summary["average_real_tokens_per_second"] == (440 + 240) / 6

    unpacked = [(1.0, {"real_tokens": 30})] * 4
    records, summary = _logged(monkeypatch, unpacked)
    assert records[0]["sequences_per_second"] == 8.0 and "rows_per_second" not in records[0]
    assert records[0]["real_tokens_per_second"] == 60.0
    assert summary["average_sequences_per_second"] == 8.0
    assert "average_rows_per_second" not in summary


def _script_choice(variable, repo_root, data_dir, **env):
    """The value scripts/pretraining_common.sh gives `variable` for `data_dir` and `env`."""
    import subprocess
    return subprocess.run(
        ["bash", "-c", f"source scripts/pretraining_common.sh; echo ${variable}"],
        cwd=repo_root, capture_output=True, text=True, check=True,
        env={"PATH": "/usr/bin:/bin", "DATA_DIR": str(data_dir), **env}).stdout.strip()


def test_scripts_pick_the_record_folder_of_the_chosen_masking_and_packing(tmp_path, repo_root):
    names = {("static", "false"): "max_pred_20_masked_lm_prob_0.15_random_seed_1_dupe_factor_5",
             ("static", "true"): "max_pred_20_masked_lm_prob_0.15_random_seed_1_dupe_factor_5"
                                 "_packed_3",
             ("dynamic", "false"): "random_seed_1_dupe_factor_1_dynamic",
             ("dynamic", "true"): "random_seed_1_dupe_factor_1_dynamic_packed_3"}
    for name in names.values():
        (tmp_path / f"tfrecord_lower_case_1_seq_len_128_{name}" / "books_wiki_en_corpus").mkdir(
            parents=True)
    for (masking, packed), name in names.items():
        chosen = _script_choice("TRAIN_DATA_PHASE1", repo_root, tmp_path, MASKING=masking,
                                PACKED=packed)
        assert chosen == str(tmp_path / f"tfrecord_lower_case_1_seq_len_128_{name}" /
                             "books_wiki_en_corpus" / "books_wiki_en_corpus_training_*.tfrecord")
    # bertPrep.py now writes NVIDIA's training/ and test/ folders: the scripts take those.
    for (masking, packed), name in names.items():
        (tmp_path / f"tfrecord_lower_case_1_seq_len_128_{name}" / "books_wiki_en_corpus" /
         "training").mkdir()
        chosen = _script_choice("TRAIN_DATA_PHASE1", repo_root, tmp_path, MASKING=masking,
                                PACKED=packed)
        assert chosen == str(tmp_path / f"tfrecord_lower_case_1_seq_len_128_{name}" /
                             "books_wiki_en_corpus" / "training")


def test_scripts_read_records_laid_out_by_nvidias_bertprep(tmp_path, repo_root):
    """Records made by NVIDIA's own bertPrep.py, at the paths its scripts read."""
    nvidia = (tmp_path / "tfrecord" / "lower_case_1_seq_len_512_max_pred_80_masked_lm_prob_0.15"
              "_random_seed_12345_dupe_factor_5_shard_1472_test_split_10" /
              "books_wiki_en_corpus" / "test")
    nvidia.mkdir(parents=True)
    assert _script_choice("EVAL_DATA_PHASE2", repo_root, tmp_path) == str(nvidia)


@pytest.mark.horovod
def test_two_horovod_ranks_train_packed_records_with_amp_xla_and_accumulation(written,
                                                                              tmp_path,
                                                                              repo_root):
    """Packed dynamic records with everything pre-training has at once: 2 Horovod ranks over
    Gloo, bfloat16 AMP, XLA, 2 micro-batches a step allreduced after accumulation. Both
    ranks must end with the same weights (their fingerprints) and the step counts hold."""
    pytest.importorskip("horovod.tensorflow", reason="Horovod not installed "
                        "(bash scripts/install.sh builds it)")
    import os
    import subprocess
    import sys

    import tensorflow as tf

    from test_pretraining import checkpoint_tensors, command_line
    data = tmp_path / "data"
    data.mkdir()
    named_config("tiny").replace(vocab_size=written["vocab_size"]).to_json_file(
        str(data / "bert_config.json"))
    folder = str(written["folder"] / f"dynamic_{PER_ROW}")
    args = command_line(data, tmp_path / "hvd", input_files_dir=folder,
                        max_seq_length=WRITTEN_SEQ, max_predictions_per_seq=10,
                        num_train_steps=2, num_accumulation_steps=2)
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    args = [horovodrun, "-np", "2", "--gloo", "-H", "localhost:2"] + args + [
        "--horovod", "--allreduce_post_accumulation", "--amp", "--amp_dtype=bfloat16",
        "--use_xla"]
    result = subprocess.run(args, capture_output=True, text=True, cwd=repo_root, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    fingerprints = {}
    for line in (result.stdout + result.stderr).splitlines():
        if "weights fingerprint" in line:
            fingerprints[int(line.split("rank ")[1].split()[0])] = float(line.rsplit(" ", 1)[1])
    assert set(fingerprints) == {0, 1} and fingerprints[0] == fingerprints[1]
    state = checkpoint_tensors(tf.train.latest_checkpoint(str(tmp_path / "hvd")))
    assert state["global_step"] == 2 and state["micro_step"] == 4
    assert all(np.all(np.isfinite(v)) for v in state.values() if v.dtype.kind == "f")


def _logging_hook_on_a_fake_clock(monkeypatch):
    """(StepLoggingHook of a 10-step run, its clock, the console lines it shows)."""
    from training import hooks
    clock = _Clock()
    monkeypatch.setattr(hooks.time, "time", clock)
    hook = hooks.StepLoggingHook({}, 1, 8, warmup_logs=0, warmup_steps=0, is_chief=True,
                                 total_steps=10)
    shown = []
    hook.begin()
    hook._progress = types.SimpleNamespace(show=shown.append, close=lambda: None)
    return hook, clock, shown


def test_skipped_steps_hold_the_progress_line_and_its_eta(monkeypatch):
    """A float16 step skipped (global_step held) is not a step done: no new record, and the
    console line says the step is held with an ETA that does not count down (it used to
    repeat `step N/total` with an ETA falling every window)."""
    hook, clock, shown = _logging_hook_on_a_fake_clock(monkeypatch)
    for step, skipped in ((1, 0), (2, 0), (2, 1), (2, 2), (2, 3), (3, 3)):
        hook.before_run(None)
        clock.now += 1.0
        hook.after_run(None, types.SimpleNamespace(results=dict(
            global_step=step, is_optimizer_step=True, total_loss=1.0, skipped_steps=skipped,
            loss_scale=2.0 ** (10 - skipped))))
    assert [record["step"] for record in hook.records] == [1, 2, 3]
    held = shown[2:5]
    assert all(text.startswith("step 2/10  held: ") for text in held), shown
    assert held[2] == "step 2/10  held: 3 steps skipped (loss scale 128)  ETA 0:00:08"
    assert len({text.rsplit("ETA", 1)[1] for text in held}) == 1
    # the next real step: its record covers the held windows too (32 rows in 4 s), and the
    # ETA after it takes the 4 s as that step's cost (6 s for 3 steps done: 2 s a step)
    assert hook.records[2]["sequences_per_second"] == 32 / 4.0
    assert shown[5].endswith("ETA 0:00:14")


def test_a_long_run_of_held_steps_is_a_few_lines_then_the_recovery(monkeypatch):
    """A float16 run whose loss scale comes down from 2**32 skips ~81 steps in a row: the
    console showed 81 "held" lines. Now the 1st, 2nd, 4th, ... 64th and the last (81st)
    before the step moves on, then the step line as before."""
    hook, clock, shown = _logging_hook_on_a_fake_clock(monkeypatch)
    windows = [(1, 0)] + [(1, skipped) for skipped in range(1, 82)] + [(2, 81), (3, 81)]
    for step, skipped in windows:
        hook.before_run(None)
        clock.now += 1.0
        hook.after_run(None, types.SimpleNamespace(results=dict(
            global_step=step, is_optimizer_step=True, total_loss=1.0, skipped_steps=skipped,
            loss_scale=2.0 ** (90 - skipped))))
    held = [text for text in shown if "held" in text]
    counts = [int(text.split("held: ")[1].split()[0]) for text in held]
    assert counts == [1, 2, 4, 8, 16, 32, 64, 81], held
    assert held[-1].startswith("step 1/10  held: 81 steps skipped (loss scale 512)")
    assert shown.index(held[-1]) == len(shown) - 3  # then the lines of steps 2 and 3
    assert shown[-2].startswith("step 2/10  loss 1") and shown[-1].startswith("step 3/10")
