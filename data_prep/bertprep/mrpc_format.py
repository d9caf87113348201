"""GLUE's MRPC files from SentEval's (``bertPrep.py --action download --dataset MRPC``).

Apart from ``text_formatting`` (corpora to one document per line): another job, its own module.
"""
from __future__ import annotations

import os
from typing import List

from data_prep.bertprep.text_formatting import _iter_utf8_lines, atomic_text_writer

def format_mrpc(folder: str) -> List[str]:
    """SentEval's MRPC files + GLUE's dev ids to GLUE's ``train.tsv``/``dev.tsv``/``test.tsv``.

    GLUE may not redistribute MRPC, so its download script splits Microsoft's training file
    into train and dev by the published pairs of ids; this does the same, so MRPC looks like
    every other GLUE task on disk.
    """
    train_src = os.path.join(folder, "msr_paraphrase_train.txt")
    test_src = os.path.join(folder, "msr_paraphrase_test.txt")
    ids_src = os.path.join(folder, "mrpc_dev_ids.tsv")
    dev_ids = set()
    for line in _iter_utf8_lines(ids_src):
        parts = line.rstrip("\r\n").split("\t")
        if len(parts) >= 2:
            dev_ids.add((parts[0], parts[1]))
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    written = []
    train_path, dev_path = os.path.join(folder, "train.tsv"), os.path.join(folder, "dev.tsv")
    with atomic_text_writer(train_path) as train, atomic_text_writer(dev_path) as dev:
        train.write(header)
        dev.write(header)
        for n, line in enumerate(_iter_utf8_lines(train_src)):
            row = line.rstrip("\r\n")
            parts = row.split("\t")
            if n == 0 or len(parts) < 5:
                continue
            (dev if (parts[1], parts[2]) in dev_ids else train).write(row + "\n")
    written += [train_path, dev_path]
    test_path = os.path.join(folder, "test.tsv")
    with atomic_text_writer(test_path) as test:
        test.write("index\t#1 ID\t#2 ID\t#1 String\t#2 String\n")
        index = 0
        for n, line in enumerate(_iter_utf8_lines(test_src)):
            parts = line.rstrip("\r\n").split("\t")
            if n == 0 or len(parts) < 5:
                continue
            test.write("\t".join([str(index)] + parts[1:5]) + "\n")
            index += 1
    written.append(test_path)
    return written
