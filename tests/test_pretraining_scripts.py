"""scripts/run_pretraining_lamb.sh runs both phases with NVIDIA's positional arguments, and a
tiny BERT pre-trained on the two books really learns."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from pretraining_records import write_random_records


def test_two_phase_script_with_small_positional_values(tmp_path, repo_root):
    from modeling import named_config
    for seq, predictions in ((128, 20), (512, 80)):
        for split, count in (("training", 24), ("test", 8)):
            folder = tmp_path / f"seq{seq}" / split
            folder.mkdir(parents=True)
            write_random_records(folder / "part-0.tfrecord", count, seq, predictions, 101,
                                 seed=seq + count)
    config = tmp_path / "bert_config.json"
    named_config("tiny").replace(vocab_size=101).to_json_file(str(config))
    env = dict(os.environ, BERT_CONFIG=str(config), RESULTS_DIR=str(tmp_path / "results"),
               PYTHON=sys.executable, DISPLAY_LOSS_STEPS="1",
               TRAIN_DATA_PHASE1=str(tmp_path / "seq128" / "training"),
               EVAL_DATA_PHASE1=str(tmp_path / "seq128" / "test"),
               TRAIN_DATA_PHASE2=str(tmp_path / "seq512" / "training"),
               EVAL_DATA_PHASE2=str(tmp_path / "seq512" / "test"))
    # batch 4/2, eval 4, lr 1e-3/5e-4, bf16, no XLA, 1 GPU, warm-up 2/1, 10 steps,
    # checkpoint every 5, accumulation 2/2, base
    args = ["bash", "scripts/run_pretraining_lamb.sh", "4", "2", "4", "1e-3", "5e-4", "bf16",
            "false", "1", "2", "1", "10", "5", "2", "2", "base"]
    result = subprocess.run(args, capture_output=True, text=True, cwd=repo_root, env=env,
                            timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    results = tmp_path / "results"
    phase1 = [json.loads(x) for x in (results / "phase_1_dllog.jsonl").read_text().splitlines()]
    phase2 = [json.loads(x) for x in (results / "phase_2_dllog.jsonl").read_text().splitlines()]
    assert [r["step"] for r in phase1 if "step" in r] == list(range(1, 10))  # 90% of 10
    # NVIDIA's phase 2: 10% of the steps x (4*2)/(2*2) global-batch ratio = 2
    assert [r["step"] for r in phase2 if "step" in r] == [1, 2]
    assert (results / "phase_1" / "model.ckpt-9.index").exists()
    assert (results / "phase_2" / "model.ckpt-2.index").exists()
    log = (results / "pretraining.log").read_text()
    assert "== phase 1: seq 128, batch 4 x 2 accumulation" in log
    assert "== phase 2: seq 512, batch 2 x 2 accumulation" in log
    # phase 2 starts from phase 1's weights (its log file keeps the INFO lines)
    assert re.search(r"Initialising \d+ of \d+ variables from .*phase_1/model\.ckpt-9",
                     (results / "phase_2" / "run_pretraining.log").read_text())
    assert (results / "phase_2" / "eval_results.txt").read_text().count("masked_lm_accuracy") == 1


def _books_to_documents(shared_data, train_file, test_file):
    """Paragraph groups of the two books as documents, one sentence a line."""
    text = ""
    for name in ("pg1342_pride_and_prejudice.txt", "pg11_alice_in_wonderland.txt"):
        with open(os.path.join(shared_data, "books", name), encoding="utf-8") as reader:
            text += reader.read() + "\n\n"
    paragraphs = [re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", text)]
    paragraphs = [p for p in paragraphs if len(p) > 40]
    documents = []
    for start in range(0, len(paragraphs), 8):
        sentences = [s for p in paragraphs[start:start + 8]
                     for s in re.split(r"(?<=[.!?])\s+", p) if s]
        documents.append("\n".join(sentences))
    cut = int(len(documents) * 0.9)
    train_file.write_text("\n\n".join(documents[:cut]) + "\n", encoding="utf-8")
    test_file.write_text("\n\n".join(documents[cut:]) + "\n", encoding="utf-8")


@pytest.mark.long
@pytest.mark.slow
def test_tiny_bert_on_the_books_lowers_mlm_loss_by_a_third(shared_data, minilm_vocab, tmp_path,
                                                          repo_root):
    from modeling import named_config
    _books_to_documents(shared_data, tmp_path / "train.txt", tmp_path / "test.txt")
    for split, dupe in (("train", 2), ("test", 1)):
        (tmp_path / split).mkdir()
        subprocess.run([sys.executable, "create_pretraining_data.py",
                        f"--input_file={tmp_path / (split + '.txt')}",
                        f"--output_file={tmp_path / split / 'part-0.tfrecord'}",
                        f"--vocab_file={minilm_vocab}", "--max_seq_length=64",
                        "--max_predictions_per_seq=10", f"--dupe_factor={dupe}"],
                       cwd=repo_root, check=True, capture_output=True, timeout=300)
    config = tmp_path / "bert_config.json"
    named_config("tiny").to_json_file(str(config))
    dllog = tmp_path / "log.jsonl"
    result = subprocess.run(
        [sys.executable, "run_pretraining.py", f"--bert_config_file={config}",
         f"--input_files_dir={tmp_path / 'train'}", f"--eval_files_dir={tmp_path / 'test'}",
         f"--output_dir={tmp_path / 'out'}", "--do_train", "--do_eval",
         "--train_batch_size=64", "--max_seq_length=64", "--max_predictions_per_seq=10",
         "--num_train_steps=300", "--num_warmup_steps=30", "--learning_rate=1e-2",
         "--display_loss_steps=1", "--eval_batch_size=64", "--max_eval_steps=20", "--amp",
         "--amp_dtype=bfloat16", f"--dllog_path={dllog}"],
        cwd=repo_root, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in dllog.read_text().splitlines()]
    steps = [r for r in records if "step" in r and "event" not in r]
    first = steps[0]["masked_lm_loss"]
    assert abs(first - np.log(30522)) < 0.5          # starts at chance: ln(vocab) = 10.3
    last = np.mean([r["masked_lm_loss"] for r in steps[-20:]])
    assert last <= 0.65 * first, (first, last)
    evaluation = dict(line.split(" = ") for line in
                      (tmp_path / "out" / "eval_results.txt").read_text().splitlines())
    assert float(evaluation["masked_lm_loss"]) <= 0.7 * first
