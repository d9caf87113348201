"""scripts/install.sh on a machine without Python 3.11, and a venv folder it must not take over.

Ubuntu 24.04 and Debian 13 ship Python 3.12 and 3.13, for which TensorFlow 2.15.1 has no
wheel. The install then fetches a Python 3.11 with uv (`uv python install 3.11`), installing uv
itself from PyPI when it is not on PATH; where that cannot be done it says in one line what to
install. These tests hide python3.11 from PATH: a folder of symlinks to the machine's programs
without any python*, pip* or uv, plus the python3 the test chooses.

* The real branch: python3 is a 3.12, uv is installed from PyPI into the install's cache, and
  its download is pointed at an empty folder (UV_PYTHON_INSTALL_MIRROR, uv's own setting), so
  it fails the same way on every machine (here its default source, GitHub's releases, cannot be
  reached either: DNS fails): one line, nothing installed.
* A uv that fetches (a stub on PATH: `python install` puts a Python 3.11 in
  UV_PYTHON_INSTALL_DIR, `python find` names it) is used, and found again by a rerun without a
  fetch. The Python it "fetches" refuses `-m venv`, so nothing is downloaded.
"""
import glob
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTALL = os.path.join(REPO, "scripts", "install.sh")
HIDDEN = ("python", "pip", "uv")


def other_python():
    """A Python 3.12 or 3.13 of this machine (pyenv's, or on PATH), or None."""
    for version in ("3.12", "3.13"):
        found = shutil.which(f"python{version}")
        candidates = ([found] if found else []) + sorted(glob.glob(
            os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/python{version}")))
        for candidate in candidates:
            if subprocess.run([candidate, "-c", "import venv, ensurepip"],
                              capture_output=True).returncode == 0:
                return candidate
    return None


def path_without_python311(tmp_path, python3=None, extra=()):
    """A PATH folder: every program of the system folders but python*, pip* and uv, then
    `python3` -> `python3` when given, and the (name, target) pairs of `extra`."""
    folder = tmp_path / "path"
    folder.mkdir()
    for system in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        if not os.path.isdir(system):
            continue
        for name in os.listdir(system):
            link = folder / name
            if name.startswith(HIDDEN) or os.path.lexists(link):
                continue
            link.symlink_to(os.path.join(system, name))
    assert not any(os.path.lexists(folder / name) for name in ("python3.11", "python3", "uv"))
    if python3:
        (folder / "python3").symlink_to(python3)
    for name, target in extra:
        (folder / name).symlink_to(target)
    return str(folder)


def run_install(tmp_path, path, *args, **variables):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("UV_", "BERT_")) and k not in ("PYTHON", "VIRTUAL_ENV")}
    env.update(PATH=path, BERT_VENV=str(tmp_path / "venv"), BERT_CACHE_DIR=str(tmp_path / "cache"),
               BERT_TF_FLAVOR="cpu", **variables)
    return subprocess.run(["bash", INSTALL, "--no-horovod", *args], env=env, capture_output=True,
                          text=True, timeout=300, cwd=str(tmp_path))


def one_line(result):
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("install.sh: ")
    return lines[0]


def executable(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def test_without_python_3_11_uv_is_fetched_and_its_failure_is_one_line(tmp_path):
    """python3 is 3.12, no uv: uv comes from PyPI into the cache and tries to fetch 3.11; its
    source has nothing: one line naming what failed and what to install, no venv."""
    python3 = other_python()
    if python3 is None:
        pytest.skip("no Python 3.12 or 3.13 with venv on this machine to stand for a newer distro's")
    mirror = tmp_path / "empty-mirror"
    mirror.mkdir()
    result = run_install(tmp_path, path_without_python311(tmp_path, python3),
                         UV_PYTHON_INSTALL_MIRROR=mirror.as_uri())
    line = one_line(result)
    assert "no Python 3.11 on PATH" in line and "set PYTHON=/path/to/python3.11" in line, line
    assert "pyenv install 3.11" in line
    assert not (tmp_path / "venv").exists()
    if "uv could not be installed" in line:  # PyPI unreachable from this machine
        pytest.skip(f"uv could not be installed from PyPI here: {line}")
    assert f"installing uv from PyPI into {tmp_path / 'cache' / 'uv'}" in result.stdout
    assert "uv python install 3.11' could not fetch one (error: " in line, line
    assert os.access(tmp_path / "cache" / "uv" / "bin" / "uv", os.X_OK)


def test_a_python_uv_fetches_is_used_and_found_again(tmp_path):
    """A uv on PATH that fetches: its Python is the one the venv is made with (here a 3.11
    that refuses `-m venv`, so the install stops there), and a rerun finds it without a fetch."""
    guard = executable(tmp_path / "guard" / "python3.11",
                       '#!/bin/sh\nif [ "$1 $2" = "-m venv" ]; then\n'
                       '  echo "guard python: no venv in this test" >&2; exit 1; fi\n'
                       f'exec {sys.executable} "$@"\n')
    uv = executable(tmp_path / "stub" / "uv", f"""#!/bin/sh
target="$UV_PYTHON_INSTALL_DIR/cpython-3.11-stub/bin/python3.11"
case "$1 $2 $3" in
  "python find 3.11") [ -x "$target" ] && {{ echo "$target"; exit 0; }}
                      echo "error: No interpreter found for Python 3.11" >&2; exit 2 ;;
  "python install 3.11") mkdir -p "$(dirname "$target")" && ln -s {guard} "$target" && exit 0 ;;
esac
exit 3
""")
    path = path_without_python311(tmp_path, extra=[("uv", uv)])
    first = run_install(tmp_path, path)
    python = tmp_path / "cache" / "python" / "cpython-3.11-stub" / "bin" / "python3.11"
    assert "fetching Python 3.11 with uv" in first.stdout, first.stdout + first.stderr
    assert f"Python 3.11: {python} (found or fetched by uv)" in first.stdout
    assert f"creating virtual environment {tmp_path / 'venv'} with {python}" in first.stdout
    assert "guard python: no venv in this test" in first.stderr

    assert not (tmp_path / "venv").exists()
    again = run_install(tmp_path, path)
    assert "fetching" not in again.stdout
    assert f"Python 3.11: {python} (found or fetched by uv)" in again.stdout


def test_no_python3_at_all_or_a_wrong_python_is_one_line(tmp_path):
    line = one_line(run_install(tmp_path, path_without_python311(tmp_path)))
    assert "no Python 3.11 (no python3.11 on PATH, no python3 at all) and no uv" in line, line
    line = one_line(run_install(tmp_path, os.environ["PATH"], PYTHON=str(tmp_path / "nothing")))
    assert f"PYTHON={tmp_path / 'nothing'} is not a Python 3.11 that runs" in line
    assert not (tmp_path / "venv").exists()


def test_a_folder_that_is_not_a_venv_is_not_taken_over(tmp_path):
    """BERT_VENV naming a folder of the user's (no pyvenv.cfg): refused, left as it was."""
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "notes.txt").write_text("mine")
    line = one_line(run_install(tmp_path, os.environ["PATH"], PYTHON=sys.executable))
    assert f"{tmp_path / 'venv'} exists and is not a virtual environment" in line
    assert os.listdir(tmp_path / "venv") == ["notes.txt"]
