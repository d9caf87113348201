"""The network check's arithmetic (runtime/allreduce_bandwidth.py) against nccl-tests' own
printed figures and the kernel's rate texts, and its measuring program
(runtime/allreduce_check.py) run for real: two Horovod ranks over Gloo on this machine."""
import json
import os
import subprocess
import sys

import pytest

from modeling.config import named_config
from reporting.errors import UsageError
from runtime import allreduce_bandwidth as bw
from runtime import allreduce_check

# all_reduce_perf rows as nccl-tests printed them: (size B, time us, algbw GB/s, busbw GB/s).
NCCL_TESTS_ROWS = {
    # https://github.com/NVIDIA/dgx-spark-playbooks/pull/103 (murat-magomedov's comment):
    # nccl-tests 2.20.0, "# Using devices" lists 2 ranks (spark-d708, spark-dbf4)
    2: [(8192, 35.15, 0.23, 0.23), (16384, 31.67, 0.52, 0.52), (32768, 39.56, 0.83, 0.83),
        (65536, 67.93, 0.96, 0.96)],
    # https://github.com/NVIDIA/nccl/issues/1411 (ProHuper): 4 GPUs on each of the 2 nodes of
    # https://github.com/NVIDIA/nccl/issues/1357, 8 ranks
    8: [(2097152, 122.3, 17.15, 30.02), (16777216, 244.7, 68.55, 119.97),
        (134217728, 1493.1, 89.89, 157.31)],
}


@pytest.mark.parametrize("ranks", sorted(NCCL_TESTS_ROWS))
def test_bandwidths_are_nccl_tests_own(ranks):
    for size, micros, algbw, busbw in NCCL_TESTS_ROWS[ranks]:
        # nccl-tests prints 2 decimals of GB/s and 2 (or 1) of us: the tolerance is theirs
        tolerance = 0.006 + 0.001 * busbw
        assert bw.algbw(size, micros * 1e-6) == pytest.approx(algbw, abs=tolerance)
        assert bw.busbw(size, micros * 1e-6, ranks) == pytest.approx(busbw, abs=tolerance)
        assert bw.allreduce_seconds(size, bw.busbw(size, micros * 1e-6, ranks), ranks) == \
            pytest.approx(micros * 1e-6)


def test_one_rank_moves_nothing_and_bad_numbers_are_refused():
    assert bw.bus_factor(1) == 0.0 and bw.bus_factor(32) == pytest.approx(62 / 32)
    for call in (lambda: bw.bus_factor(0), lambda: bw.algbw(10, 0),
                 lambda: bw.allreduce_seconds(10, 0, 2), lambda: bw.expected_busbw(0, 1),
                 lambda: bw.expected_busbw(100, 0)):
        with pytest.raises(ValueError):
            call()


# Texts as drivers/infiniband/core/sysfs.c `rate_show` prints them ("%d%s Gb/sec (%dX%s)").
@pytest.mark.parametrize("text, data_gbps", [
    ("200 Gb/sec (4X HDR)", 200.0), ("100 Gb/sec (4X EDR)", 100.0),
    ("400 Gb/sec (4X NDR)", 400.0), ("56 Gb/sec (4X FDR)", 4 * 14.0625 * 64 / 66),
    ("40 Gb/sec (4X QDR)", 32.0), ("40 Gb/sec (4X FDR10)", 40.0),
    ("2.5 Gb/sec (1X SDR)", 2.0), ("100 Gb/sec (2X HDR)", 100.0)])
def test_an_ib_ports_rate_text_gives_its_data_rate(text, data_gbps):
    assert bw.parse_ib_rate(text).data_gbps == pytest.approx(data_gbps)


@pytest.mark.parametrize("text", ["", "fast", "200 Gb/sec", "100 Gb/sec (4X HDR)",
                                  "200 Gb/sec (4X ZDR)"])
def test_a_rate_text_of_another_form_is_refused(text):
    with pytest.raises(ValueError):
        bw.parse_ib_rate(text)


def test_the_recipes_allreduce_on_each_network():
    """BERT-large's fp16 gradients over 4 DGX A100s (32 ranks): 8 HDR ports a node, or one
    10 GbE or 1 GbE link, each at its full data rate (a ceiling)."""
    large = named_config("large")
    nbytes = bw.gradient_bytes(large, "float16")
    assert nbytes == large.parameter_count() * 2 == bw.gradient_bytes(large, "float32") // 2
    # The paper's BERT-large: 340M parameters (Devlin et al. 2019, Table 1 footnote);
    # ours counts the pre-training heads, as the recipe's gradients do.
    assert 330e6 < large.parameter_count() < 345e6
    hdr = bw.expected_busbw(bw.parse_ib_rate("200 Gb/sec (4X HDR)").data_gbps, links=8)
    ten_gbe = bw.expected_busbw(bw.ethernet_gbps(10000))
    one_gbe = bw.expected_busbw(bw.ethernet_gbps(1000))
    assert (hdr, ten_gbe, one_gbe) == (200.0, 1.25, 0.125)
    # by hand: t = S * 2(n-1)/n / B
    for bus, seconds in ((hdr, 0.006514), (ten_gbe, 1.0423), (one_gbe, 10.423)):
        assert bw.allreduce_seconds(nbytes, bus, 32) == pytest.approx(seconds, rel=1e-3)
    with pytest.raises(ValueError, match="dtype"):
        bw.gradient_bytes(large, "int8")


def test_ports_and_interfaces_are_read_from_sysfs(tmp_path):
    ib = tmp_path / "infiniband"
    for device, rate, layer, state in (("mlx5_0", "200 Gb/sec (4X HDR)", "InfiniBand",
                                        "4: ACTIVE"),
                                       ("mlx5_1", "100 Gb/sec (4X EDR)", "Ethernet", "1: DOWN")):
        port = ib / device / "ports" / "1"
        port.mkdir(parents=True)
        for name, value in (("rate", rate), ("link_layer", layer), ("state", state)):
            (port / name).write_text(value + "\n")
    ports = bw.ib_ports(str(ib))
    assert [(p.device, p.port, p.state, p.link_layer, p.rate.data_gbps) for p in ports] == [
        ("mlx5_0", 1, "ACTIVE", "InfiniBand", 200.0), ("mlx5_1", 1, "DOWN", "Ethernet", 100.0)]
    assert ports[0].describe() == "mlx5_0 port 1: 200 Gb/sec (4X HDR), InfiniBand, ACTIVE"
    assert bw.ib_ports(str(tmp_path / "none")) == []
    net = tmp_path / "net"
    for interface, speed in (("eth0", "25000"), ("lo", "-1")):
        (net / interface).mkdir(parents=True)
        (net / interface / "speed").write_text(speed + "\n")
    assert bw.interface_gbps("eth0", str(net)) == 25.0
    assert bw.interface_gbps("lo", str(net)) is None
    assert bw.interface_gbps("ib0", str(net)) is None


def test_the_programs_arithmetic_and_flags():
    agreed = allreduce_check.summary(4e6, 2, [[0.002, 0.004], [0.003, 0.001]])
    assert agreed["times_s"] == [0.003, 0.004]                  # each iteration's slowest rank
    assert agreed["algbw_GBps"] == pytest.approx(4e6 / 0.0035 / 1e9)
    assert agreed["busbw_GBps"] == agreed["algbw_GBps"]         # 2(n-1)/n = 1 for 2 ranks
    assert allreduce_check.nccl_version(21605) == "2.16.5"     # NCCL_VERSION_CODE since 2.9
    assert allreduce_check.nccl_version(2408) == "2.4.8"
    assert allreduce_check.nccl_version(0) is None
    for argv, message in ((["--bytes", "0", "--output", "x.json"], "--bytes must be at least 1"),
                          (["--bytes", "8", "--iterations", "0", "--output", "x.json"],
                           "--iterations must be at least 1")):
        with pytest.raises(UsageError, match=message):
            allreduce_check.parse_args(argv)


def horovodrun(repo_root, tmp_path, *flags):
    pytest.importorskip("horovod.tensorflow", reason="Horovod not installed "
                        "(bash scripts/install.sh builds it)")
    launcher = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return subprocess.run([launcher, "-np", "2", "--gloo", "-H", "localhost:2", sys.executable,
                           "-m", "runtime.allreduce_check", *flags], cwd=repo_root,
                          capture_output=True, text=True, timeout=180)


@pytest.mark.horovod
def test_two_ranks_measure_a_real_allreduce(repo_root, tmp_path):
    output = tmp_path / "allreduce.json"
    run = horovodrun(repo_root, tmp_path, "--bytes", "4000001", "--iterations", "3",
                     "--output", str(output))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(output.read_text())
    assert (result["ranks"], result["nodes"], result["local_size"]) == (2, 1, 2)
    assert len(result["hosts"]) == 2
    # float32 on the CPU: 4,000,001 bytes round up to whole elements
    assert (result["dtype"], result["elements"], result["bytes"]) == ("float32", 1000001, 4000004)
    assert (result["controller"], result["nccl_used"]) == ("gloo", False)
    ranks = result["rank_times_s"]
    assert len(ranks) == 2 and all(len(times) == 3 for times in ranks)
    assert result["times_s"] == [max(pair) for pair in zip(*ranks)]
    mean = sum(result["times_s"]) / 3
    assert result["algbw_GBps"] == pytest.approx(4000004 / mean / 1e9)
    assert result["busbw_GBps"] == pytest.approx(result["algbw_GBps"]) and mean > 0
    lines = [line for line in run.stdout.splitlines() if "allreduce_check:" in line]
    assert len(lines) == 1 and lines[0].startswith("[0]<stdout>:allreduce_check: 4,000,004 "
                                                   "bytes (float32) over 2 rank(s) on 1 node(s)")


@pytest.mark.horovod
def test_an_output_rank_0_cannot_write_stops_every_rank_in_one_line(repo_root, tmp_path):
    missing = tmp_path / "no_such_folder" / "allreduce.json"
    run = horovodrun(repo_root, tmp_path, "--bytes", "1000", "--output", str(missing))
    assert run.returncode != 0
    errors = sorted(line for line in run.stderr.splitlines() if "allreduce_check:" in line)
    assert errors == [f"[{rank}]<stderr>:allreduce_check: --output {missing}: folder "
                      f"{missing.parent} does not exist" for rank in (0, 1)], errors
    assert not [line for line in (run.stdout + run.stderr).splitlines()
                if line.startswith(("[0]", "[1]")) and "Traceback" in line]
    assert not missing.parent.exists()
