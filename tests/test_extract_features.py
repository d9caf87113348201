"""extract_features.py end to end on real weights, against HuggingFace's hidden states."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.oracle

LINES = ["Alice was beginning to get very tired.",
         "Who is there? ||| It is I, the Caterpillar.",
         "",
         "Héllo wörld, 中文 42."]


def test_google_format_and_values_match_huggingface(minilm_checkpoint, minilm_dir, tmp_path,
                                                    repo_root):
    import torch
    from transformers import BertModel, BertTokenizerFast
    _, prefix, folder = minilm_checkpoint
    source = tmp_path / "input.txt"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    output = tmp_path / "features.jsonl"
    result = subprocess.run(
        [sys.executable, os.path.join(repo_root, "extract_features.py"),
         f"--input_file={source}", f"--output_file={output}",
         f"--vocab_file={folder}/vocab.txt", f"--bert_config_file={folder}/bert_config.json",
         f"--init_checkpoint={prefix}", "--layers=-1,-3", "--max_seq_length=24",
         "--batch_size=2"], capture_output=True, text=True, cwd=repo_root, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["linex_index"] for r in records] == [0, 1, 3]  # blank line 2 skipped

    tokenizer = BertTokenizerFast.from_pretrained(minilm_dir)
    model = BertModel.from_pretrained(minilm_dir).eval()
    for record, line in zip(records, [LINES[0], LINES[1], LINES[3]]):
        a, _, b = line.partition(" ||| ")
        encoded = tokenizer(a, b or None, return_tensors="pt")
        tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
        assert [f["token"] for f in record["features"]] == tokens
        with torch.no_grad():
            hidden = model(**encoded, output_hidden_states=True).hidden_states
        for feature_index, feature in enumerate(record["features"]):
            assert [layer["index"] for layer in feature["layers"]] == [-1, -3]
            for layer in feature["layers"]:
                expected = hidden[layer["index"]][0, feature_index].numpy()
                got = np.array(layer["values"])
                assert got.shape == (384,)
                assert np.abs(got - expected).max() < 1e-5


def test_bad_config_is_one_line(tmp_path, repo_root):
    (tmp_path / "in.txt").write_text("hello\n")
    (tmp_path / "cfg.json").write_text("{oops")
    result = subprocess.run(
        [sys.executable, os.path.join(repo_root, "extract_features.py"),
         f"--input_file={tmp_path}/in.txt", f"--output_file={tmp_path}/out.jsonl",
         f"--vocab_file={tmp_path}/vocab.txt", f"--bert_config_file={tmp_path}/cfg.json",
         f"--init_checkpoint={tmp_path}/none"], capture_output=True, text=True, cwd=repo_root,
        timeout=120)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {tmp_path}/cfg.json: invalid JSON")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out.jsonl").exists()
