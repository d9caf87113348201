"""`bert-preflight --nodes`: the multi-node check's report from faked facts (InfiniBand across
four DGX A100s, a socket fall-back where InfiniBand is there, a launch that failed, CPU ranks)
and the arithmetic it prints (the links' ceiling, the window against NVIDIA's), checked by
hand here. The real launches (horovodrun over loopback "hosts", srun under the real Slurm)
are in tests/test_nodes_check.py."""
import dataclasses
import json

import pytest

from pretraining.preflight_nodes import (NodesCheck, check_from_json, links_of, nvidia_window,
                                         report_nodes)
from pretraining.preflight_report import FAILED, FELL_BACK, PASSED
from runtime.allreduce_bandwidth import IbPort, parse_ib_rate

A100 = ("NVIDIA A100-SXM4-40GB", 42505273344)
GRADIENTS = 672452216  # BERT-large's 336,226,108 parameters in float16


def _result(ranks=32, nodes=4, seconds=0.0125, dtype="float16", nccl=True, controller="gloo"):
    nbytes = GRADIENTS
    algbw = nbytes / seconds / 1e9
    return {"ranks": ranks, "nodes": nodes, "hosts": [f"node{i // 8 + 1}" for i in range(ranks)],
            "bytes": nbytes, "dtype": dtype, "iterations": 10,
            "device": "32 rank(s), one GPU each; rank 0: GPU 0: NVIDIA A100-SXM4-40GB",
            "controller": controller, "nccl_used": nccl, "time_s": {"mean": seconds},
            "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (ranks - 1) / ranks}


HDR = tuple(f"mlx5_{i} port 1: 200 Gb/sec (4X HDR), InfiniBand, ACTIVE" for i in range(8))


def _check(**changes):
    check = NodesCheck(
        "BERT-large", "fp16", GRADIENTS, network="ib0 (InfiniBand, on every node)",
        result=_result(), nccl="NCCL 2.16.5; 4 node(s); across nodes NET/IB (InfiniBand on "
        "mlx5_0:1, mlx5_1:1); within a node P2P/IPC", inter_node="NET/IB", links=HDR,
        link_gbytes_per_s=200.0, window_seconds=65536 / (2871.89 * 4),
        window_how="DGX A100 (8x A100 40GB), scaled linearly from NVIDIA's 8-GPU figure")
    return dataclasses.replace(check, **changes)


def test_infiniband_across_four_dgx_a100s_passes_with_its_arithmetic():
    result = report_nodes(_check())
    lines = result.text.splitlines()
    assert result.status == PASSED
    assert lines[0] == "BERT preflight, nodes: the allreduce of BERT-large, fp16"
    assert lines[1] == "network: ib0 (InfiniBand, on every node)"
    busbw = GRADIENTS / 0.0125 / 1e9 * 2 * 31 / 32  # 104.2 GB/s
    assert f"bus bandwidth {busbw:.2f} GB/s" in lines[4]
    assert lines[5].endswith(f"at most 200.00 GB/s of bus bandwidth; measured "
                             f"{busbw / 200:.0%} of it")
    # the recipe's allreduce at that bandwidth is the measured mean: 12.5 ms a window
    assert "takes 0.0125 s a window at this bandwidth" in lines[6]
    assert f"of {65536 / (2871.89 * 4):.1f} s on 32 GPUs" in lines[6]
    assert f"{0.0125 / (65536 / (2871.89 * 4)):.1%} more time a step" in lines[6]
    assert lines[-1] == f"PASS: across nodes NET/IB at {busbw:.2f} GB/s"


def test_a_socket_fallback_where_infiniband_is_there_falls_back_in_one_line():
    fallback = ("NCCL crossed nodes over TCP sockets (NET/Socket) although InfiniBand is there "
                "(mlx5_0 port 1: 200 Gb/sec (4X HDR), InfiniBand, ACTIVE): libibverbs could "
                "not be loaded (rdma-core missing: install libibverbs1 / rdma-core on every "
                "node)")
    slow = _check(result=_result(seconds=1.1), inter_node="NET/Socket", fallback=fallback,
                  links=("interface eth0: 10 Gb/s",), link_gbytes_per_s=1.25)
    result = report_nodes(slow)
    assert result.status == FELL_BACK
    assert result.text.splitlines()[-1] == f"FELL BACK: {fallback}"
    assert "measured 95% of it" in result.text  # sockets at their line rate: not the issue


def test_a_launch_that_failed_or_gpus_without_nccl_say_so():
    failed = report_nodes(NodesCheck("BERT-large", "fp16", GRADIENTS, failure="exit status 1: "
                                     "slurm_launch: srun started 8 tasks, the plan has 16"))
    assert failed.status == FAILED
    assert failed.text.splitlines()[-1] == ("FAILED: exit status 1: slurm_launch: srun started "
                                            "8 tasks, the plan has 16")
    no_nccl = report_nodes(_check(result=_result(nccl=False), nccl=None, inter_node=None))
    assert no_nccl.status == FELL_BACK
    assert "the GPUs' allreduce did not use NCCL" in no_nccl.text.splitlines()[-1]
    assert "transport: Horovod's gloo over TCP (no NCCL: Horovod built without it)" in \
        no_nccl.text


def test_cpu_ranks_are_a_fall_back_unless_allowed_and_one_node_warns():
    cpu = _check(result=_result(ranks=2, nodes=1, dtype="float32", nccl=False, seconds=0.5),
                 nccl=None, inter_node=None, links=("interface lo: speed unknown",),
                 link_gbytes_per_s=None, window_seconds=None, network="lo (the route to the "
                 "batch node)")
    refused, allowed = report_nodes(cpu), report_nodes(cpu, allow_cpu=True)
    assert refused.status == FELL_BACK and allowed.status == PASSED
    assert "warning: one node: nothing crossed a network between nodes" in allowed.text
    assert "links:  this node's interface lo: speed unknown (no rate known to compare with)" \
        in allowed.text
    assert "(no NCCL: CPU ranks)" in allowed.text


def test_a_slow_network_for_its_links_warns():
    result = report_nodes(_check(result=_result(seconds=0.05)))  # 26 GB/s of 200
    assert result.status == PASSED
    assert result.warnings[0].startswith("the bus bandwidth is 13% of what this node's links "
                                         "carry")


def test_the_links_counted_are_the_transports():
    ports = [IbPort(f"mlx5_{i}", 1, "ACTIVE", "InfiniBand", parse_ib_rate("200 Gb/sec (4X HDR)"))
             for i in range(8)] + [IbPort("mlx5_8", 1, "DOWN", "InfiniBand", None)]
    described, carried = links_of("NET/IB", "ib0", lambda: ports, lambda name: None)
    assert len(described) == 8 and carried == 8 * 200 / 8
    described, carried = links_of("NET/Socket", "eth0", lambda: ports, lambda name: 10.0)
    assert described == ("interface eth0: 10 Gb/s",) and carried == 1.25
    assert links_of(None, "lo", lambda: [], lambda name: None) == (
        ("interface lo: speed unknown",), None)


def test_nvidias_window_is_the_global_batch_over_its_rate():
    seconds, how = nvidia_window(*A100, 8, "fp16")
    assert seconds == pytest.approx(65536 / 2871.89) and "DGX A100" in how
    seconds, how = nvidia_window(*A100, 32, "fp16")
    assert seconds == pytest.approx(65536 / (4 * 2871.89)) and "scaled linearly" in how
    assert nvidia_window("NVIDIA H100 80GB HBM3", None, 8, "fp16") == (None, None)


def test_the_check_survives_json():
    check = _check()
    assert check_from_json(json.dumps(dataclasses.asdict(check))) == check
