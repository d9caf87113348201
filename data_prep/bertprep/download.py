"""Fetching the public datasets and checkpoints BERT pre-training and fine-tuning start from.

Each file is fetched by ``data_prep.bertprep.fetcher`` (resumed after an interruption, retried,
verified, visible under its final name only when complete) and each archive unpacked by
``data_prep.bertprep.archives`` (never trusted to stay inside the folder it is extracted into).

Everything the project downloads is in one table, ``DATASETS``.  A ``--url`` (http(s), a
``file://`` URL or a plain local path, e.g. a dump fetched by hand) replaces the table's URL
for single-file datasets; BookCorpus has no official public URL any more and needs one.
``$BERT_PREP_MIRROR`` reads the table's files from a mirror of their sites (``mirrored``).

Errors are ``DownloadError`` (a ``DataPrepError``): one line ``<file or url>: <problem>``.
"""
from __future__ import annotations

import dataclasses
import os
import urllib.parse
from typing import Callable, Dict, List, Optional, Sequence

from data_prep.bertprep.archives import extract_archive
from data_prep.bertprep.fetcher import fetch, is_remote


@dataclasses.dataclass(frozen=True)
class Resource:
    """One file of a dataset: where it comes from and where it goes under ``download/``.

    ``dest`` is relative to the working dir's ``download/`` folder.  ``extract``: unpack the
    archive into the folder holding it (safely, see
    ``data_prep.bertprep.archives.extract_archive``).
    """
    url: str
    dest: str
    sha256: Optional[str] = None
    extract: bool = False


_GOOGLE = "https://storage.googleapis.com/bert_models"
_SQUAD = "https://rajpurkar.github.io/SQuAD-explorer/dataset"
_GLUE = "https://dl.fbaipublicfiles.com/glue/data"
_SENTEVAL = "https://dl.fbaipublicfiles.com/senteval/senteval_data"
_NGC = "https://api.ngc.nvidia.com/v2/models/nvidia"
_CODALAB = "https://worksheets.codalab.org/rest/bundles"


def _google(release: str, name: str) -> Resource:
    return Resource(f"{_GOOGLE}/{release}/{name}.zip",
                    f"google_pretrained_weights/{name}.zip", extract=True)


def _ngc(model: str, folder: str, version: str = "19.03.1") -> Resource:
    return Resource(f"{_NGC}/{model}/versions/{version}/zip",
                    f"nvidia_pretrained/{folder}/{model}_{version}.zip", extract=True)


def _glue(archive: str) -> List[Resource]:
    return [Resource(f"{_GLUE}/{archive}", f"glue/{archive}", extract=True)]


# The one table of everything downloadable.  No sha256 is published for these files (the
# providers replace "latest" dumps twice a month), so none is pinned; pass --sha256 to check one.
DATASETS: Dict[str, List[Resource]] = {
    "wikicorpus_en": [Resource(
        "https://dumps.wikimedia.org/enwiki/latest/enwiki-latest-pages-articles.xml.bz2",
        "wikicorpus_en/enwiki-latest-pages-articles.xml.bz2")],
    "wikicorpus_zh": [Resource(
        "https://dumps.wikimedia.org/zhwiki/latest/zhwiki-latest-pages-articles.xml.bz2",
        "wikicorpus_zh/zhwiki-latest-pages-articles.xml.bz2")],
    # BookCorpus is no longer distributed by its authors: there is no URL to put here.
    "bookscorpus": [],
    "google_pretrained_weights": [
        _google("2018_10_18", "uncased_L-12_H-768_A-12"),
        _google("2018_10_18", "uncased_L-24_H-1024_A-16"),
        _google("2018_10_18", "cased_L-12_H-768_A-12"),
        _google("2018_10_18", "cased_L-24_H-1024_A-16"),
        _google("2018_11_03", "multilingual_L-12_H-768_A-12"),
        _google("2018_11_23", "multi_cased_L-12_H-768_A-12"),
        _google("2018_11_03", "chinese_L-12_H-768_A-12"),
        _google("2019_05_30", "wwm_uncased_L-24_H-1024_A-16"),
        _google("2019_05_30", "wwm_cased_L-24_H-1024_A-16"),
    ],
    # NVIDIA's checkpoints from NGC, where NVIDIA's create_datasets_from_start.sh puts them
    # (download/nvidia_pretrained/<folder>/model.ckpt*): its run_squad.sh and run_glue.sh
    # start from the LAMB-pre-trained BERT-large by default.
    "nvidia_pretrained_weights": [
        _ngc("bert_tf_ckpt_large_pretraining_amp_lamb", "bert_tf_pretraining_large_lamb"),
        _ngc("bert_tf_ckpt_large_qa_squad11_amp_384", "bert_tf_squad11_large_384"),
        _ngc("bert_tf_ckpt_base_qa_squad11_amp_128", "bert_tf_squad11_base_128"),
    ],
    # With the official evaluation scripts, from where NVIDIA's SquadDownloader takes them:
    # NVIDIA's run_squad.sh passes --eval_script=$SQUAD_DIR/evaluate-v<version>.py.
    "squad": [
        Resource(f"{_SQUAD}/train-v1.1.json", "squad/v1.1/train-v1.1.json"),
        Resource(f"{_SQUAD}/dev-v1.1.json", "squad/v1.1/dev-v1.1.json"),
        Resource(f"{_CODALAB}/0xbcd57bee090b421c982906709c8c27e1/contents/blob/",
                 "squad/v1.1/evaluate-v1.1.py"),
        Resource(f"{_SQUAD}/train-v2.0.json", "squad/v2.0/train-v2.0.json"),
        Resource(f"{_SQUAD}/dev-v2.0.json", "squad/v2.0/dev-v2.0.json"),
        Resource(f"{_CODALAB}/0x6b567e1cf2e041ec80d7098f031c5c9e/contents/blob/",
                 "squad/v2.0/evaluate-v2.0.py"),
    ],
    "CoLA": _glue("CoLA.zip"),
    "SST-2": _glue("SST-2.zip"),
    "STS-B": _glue("STS-B.zip"),
    "QQP": _glue("QQP-clean.zip"),
    "MNLI": _glue("MNLI.zip"),
    "QNLI": _glue("QNLIv2.zip"),
    "RTE": _glue("RTE.zip"),
    "WNLI": _glue("WNLI.zip"),
    # GLUE cannot host MRPC; its own download script takes SentEval's copy and GLUE's dev ids
    # (``mrpc_format.format_mrpc`` turns them into train/dev/test.tsv).
    "MRPC": [
        Resource(f"{_SENTEVAL}/msr_paraphrase_train.txt", "glue/MRPC/msr_paraphrase_train.txt"),
        Resource(f"{_SENTEVAL}/msr_paraphrase_test.txt", "glue/MRPC/msr_paraphrase_test.txt"),
        Resource(f"{_GLUE}/mrpc_dev_ids.tsv", "glue/MRPC/mrpc_dev_ids.tsv"),
    ],
}
GLUE_TASKS = ("CoLA", "MRPC", "SST-2", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI")


MIRROR_ENV = "BERT_PREP_MIRROR"


def mirrored(url: str, mirror: Optional[str] = None) -> str:
    """``url`` as found on a mirror of the public sites: ``https://host/path`` ->
    ``<mirror>/host/path``, where the mirror (default ``$BERT_PREP_MIRROR``) is an http(s) or
    ``file://`` URL or a local folder. For clusters without internet access: fill the mirror
    once (the same host/path tree), and every ``download`` of the table's datasets, NVIDIA's
    scripts' included, reads from it unchanged. Without a mirror, ``url`` itself."""
    mirror = mirror if mirror is not None else os.environ.get(MIRROR_ENV, "")
    if not mirror or not is_remote(url):
        return url
    parts = urllib.parse.urlsplit(url)
    tail = parts.netloc + parts.path + (f"?{parts.query}" if parts.query else "")
    if is_remote(mirror) or mirror.lower().startswith("file:"):
        return mirror.rstrip("/") + "/" + tail
    # A folder: a URL ending in "/" (CodaLab's blobs) is the file named by its last part.
    return os.path.join(os.path.expanduser(mirror), *tail.rstrip("/").split("/"))


def download_resources(resources: Sequence[Resource], download_dir: str,
                       retries: int = 5, backoff: float = 1.0, timeout: float = 60.0,
                       progress: Optional[bool] = None,
                       log: Callable[[str], None] = print) -> List[str]:
    """Fetches (and unpacks) every resource under ``download_dir``; returns the final paths.

    An archive is unpacked once: a ``.<name>.extracted`` marker next to it records success,
    so a rerun after an interruption fetches and unpacks only what is missing.
    """
    paths = []
    for res in resources:
        dest = os.path.join(download_dir, res.dest)
        fetch(res.url, dest, res.sha256, retries=retries, backoff=backoff, timeout=timeout,
              progress=progress, log=log)
        if res.extract and os.path.isfile(dest):
            folder = os.path.dirname(dest)
            marker = os.path.join(folder, f".{os.path.basename(dest)}.extracted")
            if not os.path.exists(marker):
                names = extract_archive(dest, folder)
                with open(marker, "w", encoding="utf-8") as f:
                    f.write("\n".join(names) + "\n")
                log(f"{dest}: extracted {', '.join(names)}")
        paths.append(dest)
    return paths
