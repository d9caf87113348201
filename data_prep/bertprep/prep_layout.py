"""``bertPrep.py``'s options and the working-dir layout that chains its actions.

Each action reads what the previous one wrote, found by name under the working dir
(``--working_dir``, else the environment variable ``BERT_PREP_WORKING_DIR``)::

    download/<dataset>/                              raw downloads (GLUE tasks: download/glue/<task>/)
    formatted_one_article_per_line/<dataset>.txt     one document per line
        .formatting-<dataset>.txt/        on a Dask cluster: its parts until it is whole
    vocab/<dataset>_lower_case_<0|1>_vocab.txt       a WordPiece vocab trained by create_vocab
    sharded_training_shards_<N>_test_shards_<M>_fraction_<F>/<dataset>/
        <dataset>_training_<i>.txt, <dataset>_test_<i>.txt    one sentence a line, blank line
                                                              between documents
    tfrecord_lower_case_<0|1>_seq_len_<S>_max_pred_<P>_masked_lm_prob_<p>_random_seed_<R>_dupe_factor_<D>[_wwm][_packed_<k>]/<dataset>/
    tfrecord_lower_case_<0|1>_seq_len_<S>_random_seed_<R>_dupe_factor_<D>_dynamic[_packed_<k>]/<dataset>/
        training/<dataset>_training_<i>.tfrecord, test/<dataset>_test_<i>.tfrecord
                                          (NVIDIA's training/ and test/ folders; in the second
                                          folder with --masking dynamic: unmasked records;
                                          with --pack: rows of up to k instances)
        training.meta/, test.meta/        each file's <file>.meta.json
                                          (data_prep.instances.record_metadata: beside the folders,
                                          not in them, so `training/*` is records only)

Folder names carry the options that change their content, so runs with different options
never mix and each later action finds its input from the same flags.  Not in the names: the
sentence splitter and ``--sharding_seed`` (rerunning ``sharding`` with others replaces the
shards), and the vocabulary (use a new working dir for a new vocab).

``PrepOptions`` holds every flag of ``bertPrep.py``; ``Layout`` turns a dataset and those
options into the paths above. They live apart from the actions (``data_prep.bertprep.prep_actions``)
because more than the actions need them: the demo, the tests and the benchmarks find a
working dir's records by these names without running an action.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence, Tuple

from data_prep.errors import DataPrepError

WORKING_DIR_ENV = "BERT_PREP_WORKING_DIR"
SPLITS = ("training", "test")


@dataclasses.dataclass
class PrepOptions:
    """All flags of ``bertPrep.py`` (NVIDIA's names and defaults)."""
    action: str = ""
    dataset: str = ""
    working_dir: Optional[str] = None
    url: Optional[str] = None
    sha256: Optional[str] = None
    input: Sequence[str] = ()
    custom_document_unit: str = "block"
    wiki_expand_templates: bool = True
    n_training_shards: int = 1472
    n_test_shards: int = 1472
    fraction_test_set: float = 0.1
    sentence_splitter: str = "auto"
    sharding_seed: int = 12345
    n_processes: int = 4
    dask_scheduler: str = ""          # a running Dask cluster (address or scheduler file)
    hosts: Tuple[str, ...] = ()       # ssh hosts ("host" or "host:workers") for Dask workers
    vocab_file: Optional[str] = None
    vocab_size: int = 30522
    do_lower_case: bool = True
    max_seq_length: int = 512
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    random_seed: int = 12345
    dupe_factor: int = 5
    do_whole_word_mask: bool = False
    masking: str = "static"
    max_sequences_per_row: int = 0   # sequence packing (data_prep.instances.packing); 0: none
    download_retries: int = 5
    progress: Optional[bool] = None


@dataclasses.dataclass(frozen=True)
class Layout:
    """Paths of every stage's output under the working dir (see the module docstring)."""
    root: str

    def download_dir(self, dataset: str) -> str:
        from data_prep.bertprep.download import GLUE_TASKS
        if dataset in GLUE_TASKS:
            return os.path.join(self.root, "download", "glue", dataset)
        return os.path.join(self.root, "download", dataset)

    def formatted_file(self, dataset: str) -> str:
        return os.path.join(self.root, "formatted_one_article_per_line", f"{dataset}.txt")

    def vocab_file(self, dataset: str, do_lower_case: bool) -> str:
        return os.path.join(self.root, "vocab",
                            f"{dataset}_lower_case_{int(bool(do_lower_case))}_vocab.txt")

    def sharded_dir(self, dataset: str, o: PrepOptions) -> str:
        name = (f"sharded_training_shards_{o.n_training_shards}_test_shards_{o.n_test_shards}"
                f"_fraction_{o.fraction_test_set:g}")
        return os.path.join(self.root, name, dataset)

    def tfrecord_split_dir(self, dataset: str, o: PrepOptions, split: str) -> str:
        """The `training` or `test` records of `tfrecord_dir` (NVIDIA's layout:
        `--input_files_dir=<...>/training --eval_files_dir=<...>/test`)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return os.path.join(self.tfrecord_dir(dataset, o), split)

    def tfrecord_dir(self, dataset: str, o: PrepOptions) -> str:
        masking = (f"_max_pred_{o.max_predictions_per_seq}_masked_lm_prob_{o.masked_lm_prob:g}"
                   if o.masking == "static" else "")  # dynamic records: chosen when training
        name = (f"tfrecord_lower_case_{int(bool(o.do_lower_case))}_seq_len_{o.max_seq_length}"
                f"{masking}_random_seed_{o.random_seed}_dupe_factor_{o.dupe_factor}"
                f"{'_wwm' if o.do_whole_word_mask else ''}"
                f"{'_dynamic' if o.masking == 'dynamic' else ''}"
                f"{f'_packed_{o.max_sequences_per_row}' if o.max_sequences_per_row else ''}")
        return os.path.join(self.root, name, dataset)

def resolve_working_dir(working_dir: Optional[str]) -> str:
    """``--working_dir``, else ``$BERT_PREP_WORKING_DIR``; created and checked for writing."""
    root = working_dir or os.environ.get(WORKING_DIR_ENV)
    if not root:
        raise DataPrepError("--working_dir", f"not given and ${WORKING_DIR_ENV} is not set")
    root = os.path.abspath(os.path.expanduser(root))
    try:
        os.makedirs(root, exist_ok=True)
        probe = os.path.join(root, f".write-test-{os.getpid()}")
        with open(probe, "w", encoding="utf-8"):
            pass
        os.remove(probe)
    except OSError as e:
        raise DataPrepError(root, f"working dir is not writable: {e.strerror or e}") from None
    return root
