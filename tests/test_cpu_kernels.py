"""runtime.cpu_kernels: oneDNN switched on before TensorFlow starts, unless chosen."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = ("import sys; sys.path.insert(0, {repo!r}); "
         "from cli.command import prepare_process; prepare_process([]); "
         "import os, tensorflow as tf; "
         "from tensorflow.python.util import _pywrap_util_port as port; "
         "print(os.environ.get('TF_ENABLE_ONEDNN_OPTS'), port.IsMklEnabled())")


def probe(env_value):
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    if env_value is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE.format(repo=REPO)], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    return out[0], out[1] == "True"


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "AMD64"), reason="x86 only")
def test_entry_points_turn_onednn_on_unless_the_user_chose():
    assert probe(None) == ("1", True)          # what every command does before TensorFlow
    assert probe("0") == ("0", False)          # the user's choice is kept


def test_too_late_after_tensorflow_is_imported(monkeypatch):
    from runtime import cpu_kernels
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    monkeypatch.setitem(sys.modules, "tensorflow", sys.modules.get("tensorflow", object()))
    assert cpu_kernels.enable_onednn() is False
    assert "TF_ENABLE_ONEDNN_OPTS" not in os.environ
