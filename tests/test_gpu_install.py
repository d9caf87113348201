"""The GPU install (scripts/install.sh with BERT_TF_FLAVOR=gpu): which CUDA toolkit it takes, the
one-line failures before anything is installed (the toolkit, nvcc's host compiler, cmake), a venv
switched between the flavours, the image's InfiniBand libraries, and (opt-in) the real NCCL build.

The toolkit lookup runs through `install.sh --check-toolkit` or a full gpu install that must stop
before creating the venv, on fake toolkits (a shell `nvcc` printing a release, an empty
cuda_runtime.h, an empty libcudart_static.a, and where asked a crt/host_config.h with nvcc's
compiler guards), fake compilers and fake cmakes: seconds, no download. A full install that should
stop early gets a Python whose `-m venv` refuses, so a check that did not fire fails the test
without downloading anything. The flavour switch runs in a real venv made without pip, whose `pip`
is a stub that logs. The real build downloads tensorflow[and-cuda] (~3 GB) and compiles for
minutes, so it runs only with BERT_TEST_GPU_BUILD=1.
"""
import ast
import os
import re
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTALL = os.path.join(REPO, "scripts", "install.sh")
CHECK_GPU_BUILD = os.path.join(REPO, "scripts", "check_gpu_build.sh")
# What the tests set themselves: never the caller's (a CXX or CUDAHOSTCXX of the shell would
# change which compiler install.sh checks).
TOOLKIT_VARIABLES = ("HOROVOD_CUDA_HOME", "CUDA_HOME", "CUDA_PATH", "BERT_CUDA_ANY_VERSION",
                     "CXX", "CUDAHOSTCXX", "NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS",
                     "HOROVOD_CMAKE", "BERT_TF_FLAVOR")
REAL_NVCC = "/usr/local/cuda/bin/nvcc"


def host_config(gcc_limit, clang_limit):
    """nvcc's host-compiler guards as CUDA 12.x's include/crt/host_config.h spells them (read in
    the nvidia-cuda-nvcc-cu12 12.2.140 wheel, nvidia/cuda_nvcc/include/crt/host_config.h, lines
    139-158: `#if __GNUC__ > 12` and, for plain clang, `(__clang_major__ >= 17)`); real
    preprocessor text, so a real compiler can evaluate it (see the test of this machine's g++)."""
    return ("#if defined(__GNUC__)\n\n"
            f"#if __GNUC__ > {gcc_limit}\n\n"
            f"#error -- unsupported GNU version! gcc versions later than {gcc_limit} are not supported!\n\n"
            f"#endif /* __GNUC__ > {gcc_limit} */\n\n"
            "#if defined(__clang__) && !defined(__ibmxl_vrm__) && !defined(__ICC) && "
            "!defined(__HORIZON__) && !defined(__APPLE__)\n\n"
            f"#if (__clang_major__ >= {clang_limit}) || (__clang_major__ < 3) || "
            "((__clang_major__ == 3) &&  (__clang_minor__ < 3))\n"
            "#error -- unsupported clang version!\n"
            "#endif\n\n#endif /* defined(__clang__) */\n\n#endif /* __GNUC__ */\n")


def fake_toolkit(folder, release, lib="lib64", gcc_limit=None, clang_limit=17):
    """A folder with what install.sh checks of a CUDA toolkit; its nvcc prints `release`; with
    `gcc_limit`, an include/crt/host_config.h whose guards take GCC <= gcc_limit and clang <
    clang_limit."""
    os.makedirs(os.path.join(folder, "bin"))
    os.makedirs(os.path.join(folder, "include", "crt"))
    os.makedirs(os.path.join(folder, lib))
    nvcc = os.path.join(folder, "bin", "nvcc")
    with open(nvcc, "w") as out:
        out.write("#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                  f"echo 'Cuda compilation tools, release {release}, V{release}.1'\n")
    os.chmod(nvcc, 0o755)
    open(os.path.join(folder, "include", "cuda_runtime.h"), "w").close()
    open(os.path.join(folder, lib, "libcudart_static.a"), "w").close()
    if gcc_limit is not None:
        with open(os.path.join(folder, "include", "crt", "host_config.h"), "w") as out:
            out.write(host_config(gcc_limit, clang_limit))
    return str(folder)


def executable(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def fake_compiler(tmp_path, name, gnuc, clang_major=None):
    """A `c++` whose predefined macros (-dM -E) say GCC `gnuc` (clang also defines __GNUC__ 4)."""
    macros = f"#define __GNUC__ {gnuc}\n" + (f"#define __clang_major__ {clang_major}\n"
                                            if clang_major else "")
    return executable(tmp_path / "compilers" / name, f"#!/bin/sh\nprintf '{macros}'\n")


def fake_cmake(tmp_path, version):
    return executable(tmp_path / f"cmake-{version}" / "cmake",
                      f"#!/bin/sh\necho 'cmake version {version}'\necho\n"
                      "echo 'CMake suite maintained and supported by Kitware (kitware.com/cmake).'\n")


def guard_python(tmp_path):
    """A Python 3.11 whose `-m venv` refuses (leaving the venv folder behind): an install that
    should have stopped before its venv fails the test instead of downloading anything."""
    return executable(tmp_path / "guard" / "python",
                      '#!/bin/sh\nif [ "$1 $2" = "-m venv" ]; then mkdir -p "$3"\n'
                      '  echo "guard python: no venv in this test" >&2; exit 1; fi\n'
                      f'exec {sys.executable} "$@"\n')


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
    toolkit, compiler = accepted.stdout.splitlines()
    assert toolkit == f"CUDA toolkit: {old} (CUDA 11.8, from HOROVOD_CUDA_HOME)"
    # A toolkit without include/crt/host_config.h: its host compiler is named, not judged.
    assert compiler.startswith("host compiler: ") and compiler.endswith(
        f"not checked: {old} has no include/crt/host_config.h"), compiler


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
        return result.stdout.splitlines()[0]

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
        assert last.stdout.splitlines()[0].endswith("from the default)")


def fake_venv(tmp_path):
    """A venv whose pip does nothing and whose Horovod does not load (no horovodrun either);
    its python runs (install.sh asks it its version and whether it starts)."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (tmp_path / "venv" / "pyvenv.cfg").write_text(f"home = {os.path.dirname(sys.executable)}\n")
    (bin_dir / "python").write_text('#!/bin/sh\n[ "$1 $2" = "-m pip" ] && exit 0\n'
                                    'case "$1 $2" in "-c "*version_info*|"-c ") '
                                    f'exec {sys.executable} "$@" ;; esac\n'
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
    wheel is looked for under its CUDA version and compute-capability list. A cached wheel is
    no build: a cmake 4 and a compiler nvcc refuses do not stop it."""
    fake_venv(tmp_path)
    variables = {"BERT_TF_FLAVOR": flavor, "PYTHON": sys.executable,
                 "HOROVOD_CMAKE": fake_cmake(tmp_path, "4.0.2")}
    if flavor == "gpu":
        variables.update(HOROVOD_CUDA_HOME=fake_toolkit(tmp_path / "cuda-12.2", "12.2", gcc_limit=12),
                         HOROVOD_BUILD_CUDA_CC_LIST="80,90", CXX=fake_compiler(tmp_path, "c++", 13))
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


@pytest.mark.parametrize("family,version,limit", [("GCC", 13, 12), ("clang", 18, 16)])
def test_a_host_compiler_newer_than_the_toolkit_takes_fails_before_anything(tmp_path, family,
                                                                             version, limit):
    """CUDA 12.0-12.3 with GCC 13 failed in nvcc ("unsupported GNU version") after the 3 GB
    download; now the toolkit's own host_config.h is read and the install stops at once, in one
    line naming both versions and what to do. CUDAHOSTCXX is nvcc's compiler when set (it
    overrides the CXX Horovod's CMake would hand nvcc); nvcc's -allow-unsupported-compiler in
    NVCC_APPEND_FLAGS lets the compiler through, said as such."""
    toolkit = fake_toolkit(tmp_path / "cuda-12.2", "12.2", gcc_limit=12, clang_limit=17)
    newer = fake_compiler(tmp_path, "c++-new", 4 if family == "clang" else version,
                          clang_major=version if family == "clang" else None)
    variables = dict(HOROVOD_CUDA_HOME=toolkit, CXX=newer, HOROVOD_CMAKE=fake_cmake(tmp_path, "3.28.3"))
    result = run_install(tmp_path, BERT_TF_FLAVOR="gpu", PYTHON=guard_python(tmp_path), **variables)
    line = assert_failed_in_one_line(result, tmp_path)
    assert f"the CUDA 12.2 toolkit at {toolkit} takes {family} up to {limit}" in line, line
    assert os.path.join(toolkit, "include", "crt", "host_config.h") in line
    assert f"{newer}, {family} {version} (CXX)" in line
    assert "NVCC_APPEND_FLAGS=-allow-unsupported-compiler" in line
    if family == "GCC":
        assert "install g++-12" in line or "set CUDAHOSTCXX=" in line and "g++-12" in line
    else:
        assert f"set CUDAHOSTCXX to clang++ {limit} or older" in line

    older = fake_compiler(tmp_path, "g++-12", 12)
    taken = run_install(tmp_path, "--check-toolkit", CUDAHOSTCXX=older, **variables)
    assert taken.returncode == 0, taken.stderr
    assert taken.stdout.splitlines()[1] == (f"host compiler: {older} (CUDAHOSTCXX, GCC 12); "
                                            "CUDA 12.2's nvcc takes GCC up to 12")
    forced = run_install(tmp_path, "--check-toolkit", NVCC_APPEND_FLAGS="-O2 -allow-unsupported-compiler",
                         **variables)
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.splitlines()[1].endswith(
        "going on, at your own risk, because NVCC_APPEND_FLAGS has -allow-unsupported-compiler")


def machine_compiler():
    compiler = shutil.which("c++") or shutil.which("g++")
    if not compiler:
        pytest.skip("no c++ or g++ on this machine")
    macros = subprocess.run([compiler, "-dM", "-E", "-x", "c++", os.devnull], capture_output=True,
                            text=True).stdout
    gnuc = re.search(r"^#define __GNUC__ (\d+)$", macros, re.M)
    if not gnuc or "__clang__" in macros:
        pytest.skip(f"{compiler} is not GCC")
    return compiler, int(gnuc.group(1))


def test_this_machines_gcc_against_a_toolkit_at_and_below_its_version(tmp_path):
    """The verdict agrees with the compiler's own: g++ preprocessing the same host_config.h (as
    nvcc's host pass does, __CUDACC__ defined) errors exactly when the install refuses."""
    compiler, gnuc = machine_compiler()
    for limit in (gnuc, gnuc - 1):
        toolkit = fake_toolkit(tmp_path / f"cuda-{limit}", "12.2", gcc_limit=limit)
        header = os.path.join(toolkit, "include", "crt", "host_config.h")
        reference = subprocess.run([compiler, "-D__CUDACC__", "-E", "-x", "c++", header],
                                   capture_output=True, text=True)
        result = run_install(tmp_path, "--check-toolkit", HOROVOD_CUDA_HOME=toolkit)
        if limit == gnuc:
            assert reference.returncode == 0, reference.stderr
            assert result.returncode == 0, result.stderr
            assert re.fullmatch(rf"host compiler: \S+ \(the (c|g)\+\+ on PATH, GCC {gnuc}\); "
                                rf"CUDA 12.2's nvcc takes GCC up to {gnuc}",
                                result.stdout.splitlines()[1]), result.stdout
        else:
            assert "unsupported GNU version" in reference.stderr
            assert result.returncode == 1 and f"takes GCC up to {limit} ({header})" in result.stderr


@pytest.mark.skipif(not os.path.isfile(REAL_NVCC), reason=f"no CUDA toolkit at {REAL_NVCC}")
def test_the_real_toolkit_takes_what_its_nvcc_takes(tmp_path):
    """This machine's real toolkit (CUDA 13 here: BERT_CUDA_ANY_VERSION=1): the install reads the
    GCC limit from its header; nvcc itself (preprocessing a kernel with -ccbin) is the reference,
    for this machine's g++ and for a g++ made to say it is one version past the limit."""
    compiler, _ = machine_compiler()
    source = tmp_path / "kernel.cu"
    source.write_text("__global__ void kernel() {}\nint main() { kernel<<<1, 1>>>(); return 0; }\n")

    def nvcc_takes(host):
        return subprocess.run([REAL_NVCC, "-ccbin", host, "-E", str(source), "-o", os.devnull],
                              capture_output=True, text=True)

    result = run_install(tmp_path, "--check-toolkit", BERT_CUDA_ANY_VERSION="1")
    limit = int(re.search(r"takes GCC up to (\d+)", result.stdout + result.stderr).group(1))
    # Where nvcc takes this machine's compiler (CUDA 13 and GCC 12 here) the install does too.
    assert (result.returncode == 0) == (nvcc_takes(compiler).returncode == 0), result.stderr

    past = executable(tmp_path / "past" / "g++", f"#!/bin/sh\nexec {compiler} -D__GNUC__={limit + 1} "
                      '-Wno-builtin-macro-redefined "$@"\n')
    refused = nvcc_takes(past)
    assert refused.returncode != 0 and "unsupported GNU version" in refused.stderr
    result = run_install(tmp_path, "--check-toolkit", BERT_CUDA_ANY_VERSION="1", CUDAHOSTCXX=past)
    line = assert_failed_in_one_line(result, tmp_path)
    assert f"takes GCC up to {limit}" in line and f"GCC {limit + 1} (CUDAHOSTCXX)" in line


@pytest.mark.parametrize("version,refused", [("4.0.2", "does not configure with cmake 4"),
                                             ("3.12.4", "older than the 3.13"), ("3.28.3", None)])
def test_cmake_outside_3_13_to_3_x_fails_before_anything(tmp_path, version, refused):
    """Horovod's bundled Gloo does not configure with cmake 4 (checked with pip's cmake 4.4.5:
    "Compatibility with CMake < 3.5 has been removed"): a build refuses it before the venv, in
    one line with what to do; `--check-build` shows what a build would use."""
    cmake = fake_cmake(tmp_path, version)
    if refused:
        result = run_install(tmp_path, BERT_TF_FLAVOR="cpu", HOROVOD_CMAKE=cmake,
                             PYTHON=guard_python(tmp_path))
        line = assert_failed_in_one_line(result, tmp_path)
        assert f"{cmake} (HOROVOD_CMAKE) is cmake {version}" in line and refused in line
        assert "apt-get install cmake" in line and '"cmake>=3.13,<4"' in line
    else:
        result = run_install(tmp_path, "--check-build", BERT_TF_FLAVOR="cpu", HOROVOD_CMAKE=cmake)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[:2] == ["flavour: cpu",
                                                  f"cmake: {cmake} (cmake {version}, from HOROVOD_CMAKE)"]


def venv_without_pip(tmp_path, packages):
    """A real venv (no pip) holding `packages` as bare dist-info folders {name: (version,
    [Requires-Dist lines])}, and a `pip` module that logs its arguments and, for `uninstall`,
    removes those folders."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*")) / "site-packages"
    for name, (version, requires) in packages.items():
        info = site / f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                       + "".join(f"Requires-Dist: {line}\n" for line in requires))
    (site / "pip").mkdir()
    (site / "pip" / "__init__.py").write_text("")
    (site / "pip" / "__main__.py").write_text(
        "import glob, os, re, shutil, sys\n"
        "with open(os.environ['STUB_PIP_LOG'], 'a') as log:\n"
        "    log.write(' '.join(sys.argv[1:]) + '\\n')\n"
        "if sys.argv[1] == 'uninstall':\n"
        "    site = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))\n"
        "    for name in (a for a in sys.argv[2:] if not a.startswith('-')):\n"
        "        for info in glob.glob(os.path.join(site, re.sub(r'[-_.]+', '_', name) + '-*.dist-info')):\n"
        "            shutil.rmtree(info)\n")
    return venv


def pip_calls(tmp_path):
    return [line.split()[:2] + [" ".join(line.split()[2:])]
            for line in (tmp_path / "pip.log").read_text().splitlines()]


def test_a_cpu_venv_switched_to_gpu_loses_tensorflow_cpu_first(tmp_path):
    """Both wheels provide the `tensorflow` module: tensorflow-cpu is uninstalled before
    .[gpu] is installed (after would delete files the two share), in one line; a rerun of the
    same flavour removes nothing."""
    venv = venv_without_pip(tmp_path, {"tensorflow-cpu": ("2.15.1", ["numpy<2"]),
                                       "numpy": ("1.26.4", [])})
    variables = dict(BERT_TF_FLAVOR="gpu", PYTHON=sys.executable, STUB_PIP_LOG=str(tmp_path / "pip.log"))
    result = run_install(tmp_path, "--no-horovod", **variables)
    assert result.returncode == 0, result.stderr
    assert (f"[install] the gpu flavour replaces the other one in {venv}: removing tensorflow-cpu "
            "2.15.1 (one TensorFlow only may provide the tensorflow module)\n") in result.stdout
    calls = pip_calls(tmp_path)
    assert [call[:2] for call in calls] == [["install", "-q"], ["uninstall", "-y"], ["install", "-q"]]
    assert calls[1][2] == "-q tensorflow-cpu" and calls[2][2] == f"-e {REPO}[gpu,test]"

    (venv / ".bert-tf-installed").unlink()
    (tmp_path / "pip.log").unlink()
    again = run_install(tmp_path, "--no-horovod", **variables)
    assert again.returncode == 0 and "replaces" not in again.stdout
    assert [call[0] for call in pip_calls(tmp_path)] == ["install", "install"]


def test_a_gpu_venv_switched_to_cpu_loses_tensorflow_and_the_cuda_packages_only_it_needed(tmp_path):
    """tensorflow goes with the [and-cuda] packages nothing else needs; a CUDA package another
    package requires stays, with what it needs in turn; under --no-horovod the Horovod built
    for the gpu flavour goes too."""
    cuda = ("nvidia-cublas-cu12", "nvidia-cusolver-cu12", "nvidia-nccl-cu12", "nvidia-nvjitlink-cu12")
    packages = {"tensorflow": ("2.15.1", ["numpy<2"] + [f"{name} (==12.2) ; extra == 'and-cuda'"
                                                        for name in cuda]),
                "nvidia-cublas-cu12": ("12.2.5.6", []), "nvidia-nccl-cu12": ("2.16.5", []),
                "nvidia-cusolver-cu12": ("11.5.2.141", ["nvidia-cublas-cu12", "nvidia-nvjitlink-cu12"]),
                "nvidia-nvjitlink-cu12": ("12.2.140", []),
                "torch": ("2.1.0", ['nvidia-cusolver-cu12 ; platform_system == "Linux"']),
                "horovod": ("0.28.1", ["psutil"]), "numpy": ("1.26.4", [])}
    venv = venv_without_pip(tmp_path, packages)
    result = run_install(tmp_path, "--no-horovod", BERT_TF_FLAVOR="cpu", PYTHON=sys.executable,
                         STUB_PIP_LOG=str(tmp_path / "pip.log"))
    assert result.returncode == 0, result.stderr
    assert (f"the cpu flavour replaces the other one in {venv}: removing tensorflow 2.15.1, horovod "
            "0.28.1, nvidia-nccl-cu12 2.16.5 (one TensorFlow only may provide the tensorflow module); "
            "keeping nvidia-cublas-cu12 (needed by nvidia-cusolver-cu12), nvidia-cusolver-cu12 "
            "(needed by torch), nvidia-nvjitlink-cu12 (needed by nvidia-cusolver-cu12)\n") in result.stdout
    calls = pip_calls(tmp_path)
    assert calls[1] == ["uninstall", "-y", "-q tensorflow horovod nvidia-nccl-cu12"]
    assert calls[2] == ["install", "-q", f"-e {REPO}[cpu,test]"]


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
