"""runtime.threads: thread pools sized by the CPUs a rank may really use."""
import os

import pytest

from runtime.threads import available_cpus, cgroup_cpu_limit, choose_threads


@pytest.mark.parametrize("text, cpus", [("200000 100000", 2), ("150000 100000", 2),
                                        ("50000 100000", 1), ("max 100000", None)])
def test_cgroup_quota_is_read_as_whole_cpus(tmp_path, text, cpus):
    path = tmp_path / "cpu.max"
    path.write_text(text + "\n")
    assert cgroup_cpu_limit(str(path)) == cpus


def test_missing_cgroup_file_means_no_limit(tmp_path):
    assert cgroup_cpu_limit(str(tmp_path / "absent")) is None


def test_available_cpus_follow_the_affinity_mask():
    assert available_cpus() <= len(os.sched_getaffinity(0))
    original = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(original)})
        assert available_cpus() == 1
    finally:
        os.sched_setaffinity(0, original)


def test_cpu_ranks_share_the_cores_and_keep_two_inter_op_threads(monkeypatch):
    monkeypatch.delenv("BERT_INTRA_OP_THREADS", raising=False)
    monkeypatch.delenv("BERT_INTER_OP_THREADS", raising=False)
    assert choose_threads(1, cpus=64)[:2] == (64, 2)
    assert choose_threads(4, cpus=64)[:2] == (16, 2)
    assert choose_threads(4, cpus=2)[:2] == (1, 1)     # more ranks than cores: one each
    intra, inter, why = choose_threads(8, cpus=64)
    assert (intra, inter) == (8, 2) and "64 CPUs" in why and "8 ranks" in why
    assert choose_threads(8, has_gpu=True, cpus=64)[:2] == (0, 0)   # TensorFlow's defaults


def test_environment_overrides_the_choice(monkeypatch):
    monkeypatch.setenv("BERT_INTRA_OP_THREADS", "3")
    monkeypatch.setenv("BERT_INTER_OP_THREADS", "1")
    assert choose_threads(1, cpus=64)[:2] == (3, 1)


def test_the_session_config_of_a_single_rank_uses_the_choice(monkeypatch):
    monkeypatch.setenv("BERT_INTRA_OP_THREADS", "1")
    from runtime.distributed import Workers
    config = Workers().session_config()
    assert config.intra_op_parallelism_threads == 1
    assert config.inter_op_parallelism_threads == 1
