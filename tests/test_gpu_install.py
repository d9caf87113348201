"""The GPU install (scripts/install.sh with BERT_TF_FLAVOR=gpu): which CUDA toolkit it takes, the
one-line failures before anything is installed, and (opt-in) the real NCCL build.

The toolkit lookup runs through `install.sh --check-toolkit` or a full gpu install that must stop
before creating the venv, on fake toolkits (a shell `nvcc` printing a release, an empty
cuda_runtime.h, an empty libcudart_static.a): seconds, no download. The real build downloads
tensorflow[and-cuda] (~3 GB) and compiles for minutes, so it runs only with BERT_TEST_GPU_BUILD=1.
"""
import ast
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTALL = os.path.join(REPO, "scripts", "install.sh")
CHECK_GPU_BUILD = os.path.join(REPO, "scripts", "check_gpu_build.sh")
TOOLKIT_VARIABLES = ("HOROVOD_CUDA_HOME", "CUDA_HOME", "CUDA_PATH", "BERT_CUDA_ANY_VERSION")


def fake_toolkit(folder, release, lib="lib64"):
    """A folder with what install.sh checks of a CUDA toolkit; its nvcc prints `release`."""
    os.makedirs(os.path.join(folder, "bin"))
    os.makedirs(os.path.join(folder, "include"))
    os.makedirs(os.path.join(folder, lib))
    nvcc = os.path.join(folder, "bin", "nvcc")
    with open(nvcc, "w") as out:
        out.write("#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                  f"echo 'Cuda compilation tools, release {release}, V{release}.1'\n")
    os.chmod(nvcc, 0o755)
    open(os.path.join(folder, "include", "cuda_runtime.h"), "w").close()
    open(os.path.join(folder, lib, "libcudart_static.a"), "w").close()
    return str(folder)


def path_without_nvcc(*first):
    """This PATH minus every folder holding an nvcc, after the folders in `first`."""
    kept = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not os.path.exists(os.path.join(d, "nvcc"))]
    return os.pathsep.join(list(first) + kept)


def run_install(tmp_path, *args, path=None, **variables):
    env = {k: v for k, v in os.environ.items() if k not in TOOLKIT_VARIABLES}
    env.update(PATH=path or path_without_nvcc(), BERT_VENV=str(tmp_path / "venv"),
               BERT_CACHE_DIR=str(tmp_path / "cache"), **variables)
    return subprocess.run(["bash", INSTALL, *args], env=env, capture_output=True, text=True,
                          timeout=60, cwd=str(tmp_path))


def assert_failed_in_one_line(result, tmp_path):
    assert result.returncode != 0
    assert result.stdout == "", result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("install.sh: ")
    assert not (tmp_path / "venv").exists() and not (tmp_path / "cache").exists()
    return lines[0]


def test_gpu_install_without_a_toolkit_fails_in_one_line_and_installs_nothing(tmp_path):
    empty = tmp_path / "empty-cuda"
    empty.mkdir()
    result = run_install(tmp_path, BERT_TF_FLAVOR="gpu", CUDA_HOME=str(empty))
    line = assert_failed_in_one_line(result, tmp_path)
    assert f"{empty} (CUDA_HOME)" in line
    for missing in ("bin/nvcc", "include/cuda_runtime.h", "libcudart"):
        assert missing in line
    for advice in ("CUDA 12", "CUDA_HOME", "Dockerfile", "BERT_TF_FLAVOR=cpu"):
        assert advice in line


def test_a_named_toolkit_that_lacks_a_piece_is_not_passed_over(tmp_path):
    """CUDA_HOME names an incomplete toolkit while CUDA_PATH names a good one: the install
    stops on CUDA_HOME's rather than building with another toolkit than the one named."""
    empty = tmp_path / "empty-cuda"
    empty.mkdir()
    good = fake_toolkit(tmp_path / "cuda-12.2", "12.2")
    result = run_install(tmp_path, "--check-toolkit", CUDA_HOME=str(empty), CUDA_PATH=good)
    line = assert_failed_in_one_line(result, tmp_path)
    assert str(empty) in line and good not in line


def test_nvcc_of_another_cuda_is_refused_in_one_line_unless_overridden(tmp_path):
    old = fake_toolkit(tmp_path / "cuda-11.8", "11.8")
    result = run_install(tmp_path, BERT_TF_FLAVOR="gpu", HOROVOD_CUDA_HOME=old)
    line = assert_failed_in_one_line(result, tmp_path)
    assert "CUDA 11.8" in line and old in line and "CUDA 12" in line
    assert "BERT_CUDA_ANY_VERSION=1" in line

    accepted = run_install(tmp_path, "--check-toolkit", HOROVOD_CUDA_HOME=old,
                           BERT_CUDA_ANY_VERSION="1")
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.strip() == f"CUDA toolkit: {old} (CUDA 11.8, from HOROVOD_CUDA_HOME)"


def test_nvcc_without_a_release_is_refused_in_one_line(tmp_path):
    broken = fake_toolkit(tmp_path / "cuda", "12.2")
    with open(os.path.join(broken, "bin", "nvcc"), "w") as out:
        out.write("#!/bin/sh\necho 'nvcc: cannot start' >&2\nexit 1\n")
    line = assert_failed_in_one_line(run_install(tmp_path, "--check-toolkit", CUDA_HOME=broken),
                                     tmp_path)
    assert "names no 'release X.Y'" in line and broken in line


@pytest.mark.parametrize("lib", ["lib64", "lib"])
def test_toolkit_lookup_order(tmp_path, lib):
    """HOROVOD_CUDA_HOME, CUDA_HOME, CUDA_PATH, the nvcc on PATH (through a symlink), then
    /usr/local/cuda: each found toolkit is told apart by its release."""
    homes = {name: fake_toolkit(tmp_path / name, release, lib) for name, release in
             (("horovod", "12.1"), ("home", "12.2"), ("path", "12.3"), ("on-path", "12.4"))}
    link_bin = tmp_path / "links" / "bin"
    link_bin.mkdir(parents=True)
    os.symlink(os.path.join(homes["on-path"], "bin", "nvcc"), link_bin / "nvcc")
    variables = {"HOROVOD_CUDA_HOME": homes["horovod"], "CUDA_HOME": homes["home"],
                 "CUDA_PATH": homes["path"]}
    path = path_without_nvcc(str(link_bin))

    def found(**chosen):
        result = run_install(tmp_path, "--check-toolkit", path=path, **chosen)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert found(**variables) == f"CUDA toolkit: {homes['horovod']} (CUDA 12.1, from HOROVOD_CUDA_HOME)"
    del variables["HOROVOD_CUDA_HOME"]
    assert found(**variables) == f"CUDA toolkit: {homes['home']} (CUDA 12.2, from CUDA_HOME)"
    del variables["CUDA_HOME"]
    assert found(**variables) == f"CUDA toolkit: {homes['path']} (CUDA 12.3, from CUDA_PATH)"
    assert found() == (f"CUDA toolkit: {homes['on-path']} (CUDA 12.4, from nvcc on PATH, "
                       f"{link_bin / 'nvcc'})")

    last = run_install(tmp_path, "--check-toolkit", BERT_CUDA_ANY_VERSION="1")
    assert "/usr/local/cuda" in last.stdout + last.stderr
    if os.path.isfile("/usr/local/cuda/bin/nvcc"):
        assert last.stdout.startswith("CUDA toolkit: /usr/local/cuda (CUDA ")
        assert last.stdout.strip().endswith("from the default)")


def fake_venv(tmp_path):
    """A venv whose pip does nothing and whose Horovod does not load (no horovodrun either)."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text('#!/bin/sh\n[ "$1 $2" = "-m pip" ] && exit 0\n'
                                    'echo "ImportError: no Horovod here" >&2\nexit 1\n')
    (bin_dir / "python").chmod(0o755)


def cached_wheel(tmp_path, build_key):
    py_tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    folder = tmp_path / "cache" / "wheels" / f"horovod-0.28.1-tf2.15.1-{py_tag}-{build_key}"
    folder.mkdir(parents=True)
    (folder / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl").write_bytes(b"not a wheel")
    return folder


@pytest.mark.parametrize("flavor", ["cpu", "gpu"])
def test_a_cached_horovod_that_lacks_what_the_flavour_needs_is_removed(tmp_path, flavor):
    """The install ends by asking Horovod what it has: a cached wheel that fails is deleted
    (so a rerun rebuilds it), the stamp is not written, and the failure is one line. The gpu
    wheel is looked for under its CUDA version and compute-capability list."""
    fake_venv(tmp_path)
    variables = {"BERT_TF_FLAVOR": flavor, "PYTHON": sys.executable}
    if flavor == "gpu":
        variables.update(HOROVOD_CUDA_HOME=fake_toolkit(tmp_path / "cuda-12.2", "12.2"),
                         HOROVOD_BUILD_CUDA_CC_LIST="80,90")
    wheel_dir = cached_wheel(tmp_path, "cpu" if flavor == "cpu" else "gpu-cuda12.2-cc80_90")
    result = run_install(tmp_path, **variables)
    assert result.returncode == 1
    assert f"reusing the cached Horovod wheel in {wheel_dir}" in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    needed = "TensorFlow Gloo" + (" NCCL" if flavor == "gpu" else "")
    assert f"Horovod lacks {needed}" in lines[0] and f"removed the cached wheel {wheel_dir}" in lines[0]
    assert not wheel_dir.exists()
    assert not (tmp_path / "venv" / ".bert-tf-installed").exists()


def test_the_image_carries_the_infiniband_libraries_nccl_loads():
    """NCCL's IB transport dlopens libibverbs.so.1 (NVIDIA/nccl src/misc/ibvsymbols.cc) and
    libibverbs needs its provider (mlx5 and the others: ibverbs-providers, which libibverbs1
    only Recommends, so --no-install-recommends would leave it out) to see any device."""
    with open(os.path.join(REPO, "Dockerfile")) as dockerfile:
        text = dockerfile.read().replace("\\\n", " ")
    installs = [line for line in text.splitlines() if "apt-get install" in line]
    packages = {word for line in installs for word in line.split()}
    for package in ("libibverbs1", "ibverbs-providers", "librdmacm1", "ibverbs-utils"):
        assert package in packages, (package, installs)
    assert all("--no-install-recommends" in line for line in installs)


def test_the_gpu_extra_brings_pynvml():
    """runtime/devices.py reads each GPU's memory through `pynvml`, which the nvidia-ml-py
    package provides; without it in the gpu extra, GPU memory is unknown on every real install."""
    with open(os.path.join(REPO, "setup.py")) as source:
        tree = ast.parse(source.read())
    extras = next(node.value for node in ast.walk(tree)
                  if isinstance(node, ast.keyword) and node.arg == "extras_require")
    gpu = next(value for key, value in zip(extras.keys, extras.values) if key.value == "gpu")
    requirements = [element.value for element in gpu.elts if isinstance(element, ast.Constant)]
    nvml = [r for r in requirements if re.match(r"nvidia-ml-py\b", r)]
    assert nvml and re.search(r">=\s*12\.535", nvml[0]) and "<" in nvml[0], requirements


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("BERT_TEST_GPU_BUILD") != "1",
                    reason="builds Horovod with NCCL for real (downloads tensorflow[and-cuda], "
                           "~3 GB, and compiles for minutes): set BERT_TEST_GPU_BUILD=1 to run")
def test_check_gpu_build_builds_horovod_with_nccl(tmp_path):
    folder = os.environ.get("BERT_TEST_GPU_BUILD_DIR", str(tmp_path))
    result = subprocess.run(["bash", CHECK_GPU_BUILD, folder], capture_output=True, text=True,
                            timeout=3 * 3600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert re.search(r"^\s*\[X\] NCCL$", output, re.M), output[-4000:]
    assert re.search(r"^\s*\[X\] Gloo$", output, re.M), output[-4000:]
    assert "hvd.init(): rank 0 of 1, nccl_built=" in output
    # Independently of the script's own report: the built library resolves libnccl from the venv.
    site = os.path.join(folder, "venv", "lib", "python3.11", "site-packages")
    mpi_lib = next(os.path.join(site, "horovod", "tensorflow", name)
                   for name in os.listdir(os.path.join(site, "horovod", "tensorflow"))
                   if name.startswith("mpi_lib") and name.endswith(".so"))
    ldd = subprocess.run(["ldd", mpi_lib], capture_output=True, text=True).stdout
    nccl = [line for line in ldd.splitlines() if "libnccl" in line]
    assert nccl and "not found" not in nccl[0], ldd
    assert os.path.realpath(nccl[0].split("=>")[1].split()[0]) == os.path.realpath(
        os.path.join(site, "nvidia", "nccl", "lib", "libnccl.so.2"))
