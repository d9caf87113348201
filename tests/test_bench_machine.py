"""bench/machine.py's stand-in for a narrower CPU: what the tables name, and a ceiling that
is measured capped instead of aborting (a benchmark, not a speed, is checked here)."""
import importlib.util
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# loaded from its file: bench/ on sys.path would hide packages (bench/data_prep.py)
_SPEC = importlib.util.spec_from_file_location("bench_machine",
                                               os.path.join(REPO, "bench", "machine.py"))
machine = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(machine)

CPUINFO = {"model name": "AMD EPYC", "cpu family": "26", "model": "2",
           "vendor_id": "AuthenticAMD", "flags": "fpu avx2 avx512f avx512_bf16"}


@pytest.fixture
def uncapped(monkeypatch):
    """No cap now, and none left behind: a cap in this process's environment would reach
    oneDNN where it starts later, in another test, and take its bf16 kernels away."""
    for variable in machine.INSTRUCTION_SET_CAPS["avx2"]:
        monkeypatch.setenv(variable, "")  # recorded, so the teardown restores what was
        monkeypatch.delenv(variable)
    return monkeypatch


@pytest.mark.parametrize("flags, generation", [("avx2 avx512f avx512_bf16", "Zen 4"),
                                               ("avx2", "Zen 3")])
def test_family_25_is_named_zen_4_with_avx512_and_zen_3_without(uncapped, flags, generation):
    """AMD's family 25 holds both (Milan is model 1, Genoa model 17): AVX-512 tells them apart."""
    fields = dict(CPUINFO, **{"cpu family": "25", "model": "17", "flags": flags})
    assert machine.cpu_name(fields).startswith(f"AMD EPYC (family 25 model 17: {generation}; ")


def test_a_capped_run_says_so_in_the_cpu_it_names(uncapped):
    assert machine.cpu_name(CPUINFO) == ("AMD EPYC (family 26 model 2: Zen 5; avx512_bf16, "
                                         "avx512f, avx2)")
    machine.cap_instruction_set("avx2")
    assert os.environ["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2"
    assert os.environ["FBGEMM_ENABLE_INSTRUCTIONS"] == "AVX2"
    assert machine.cpu_name(CPUINFO).endswith(
        "avx2; capped at AVX2 (ONEDNN_MAX_CPU_ISA, DNNL_MAX_CPU_ISA, ATEN_CPU_CAPABILITY, "
        "MKL_ENABLE_INSTRUCTIONS, FBGEMM_ENABLE_INSTRUCTIONS))")
    machine.cap_instruction_set(None)  # no cap asked: nothing changes
    assert machine.instruction_set_cap() == "AVX2"
    machine.cap_instruction_set("avx512_bf16")  # a Zen 4 or 5 stood in for by an AMX Xeon
    assert machine.cpu_name(CPUINFO).endswith(
        "capped at AVX512_CORE_BF16 (ONEDNN_MAX_CPU_ISA, DNNL_MAX_CPU_ISA, ATEN_CPU_CAPABILITY, "
        "MKL_ENABLE_INSTRUCTIONS, FBGEMM_ENABLE_INSTRUCTIONS))")
    assert os.environ["FBGEMM_ENABLE_INSTRUCTIONS"] == "AVX512_E1"


def test_the_ceiling_under_an_avx2_cap_is_fp32_only_and_measured(uncapped):
    """oneDNN capped at AVX2 has no bf16 matmul; asking for one aborted the ceiling worker
    (where the CPU has AVX512_BF16). Capped, the worker measures fp32 and leaves bf16 out."""
    machine.cap_instruction_set("avx2")
    ceiling = machine.matmul_ceiling(size=256, seconds=0.2)
    assert set(ceiling) == {"fp32"}
    assert ceiling["fp32"] > 0
