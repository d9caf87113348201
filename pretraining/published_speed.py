"""NVIDIA's published BERT-large pre-training speeds, as data, and the figure a measured run
compares with.

Why: a run that trains at half the speed it should (no NCCL, XLA off, a throttled GPU, the
wrong precision) looks healthy from inside; only a reference says it is slow. NVIDIA
published single-node steady-state throughputs (sequences per second, all GPUs together) of
its TensorFlow BERT-large pre-training in DeepLearningExamples'
TensorFlow/LanguageModeling/BERT/README.md, section "Training performance results" (the
tables "Pre-training training performance: single-node on ..."; TensorFlow 20.06-py3 NGC
container, `scripts/run_pretraining_lamb.sh`). `TABLES` transcribes those four tables row by
row (tests/test_preflight.py compares them with the README where a copy exists). Each row
has a mixed-precision value and a value without AMP: FP32 on V100, TF32 on A100 (NVIDIA's
`fp32` runs use TF32 there; this project's `fp32` and `tf32` are both `--noamp`).

`table_for` picks a table by the GPU's name and memory; `figure` reads it for a sequence
length, precision and GPU count, interpolating (and saying so) between published counts;
`phase_batch` is NVIDIA's per-GPU batch of a phase (sequence length 128 or 512) for a GPU and
precision.
"""
import dataclasses
import re
from typing import Optional, Tuple

GB = 1e9
GIB = 1024 ** 3
MIXED, FULL = "mixed", "full"   # AMP (fp16; bf16 compared with it) | no AMP (FP32 or TF32)
PRECISION_CLASS = {"fp16": MIXED, "bf16": MIXED, "fp32": FULL, "tf32": FULL}
README = "TensorFlow/LanguageModeling/BERT/README.md"
SECTION = "Training performance results"


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of a table: (mixed, full) pairs as NVIDIA's columns give them."""
    gpus: int
    seq: int
    batch: Tuple[int, int]            # per GPU
    accumulation: Tuple[int, int]
    global_batch: int
    rate: Tuple[float, float]         # sequences/s, all GPUs together
    weak_scaling: Tuple[float, float]  # rate / the 1-GPU rate


@dataclasses.dataclass(frozen=True)
class Table:
    system: str        # "DGX A100 (8x A100 40GB)"
    gpu: str           # "A100 40GB"
    memory_gb: int     # the GPU's memory, nominal
    subsection: str    # the README's heading of the table
    full_name: str     # what the non-AMP column measured: "FP32" | "TF32"
    rows: Tuple[Row, ...]

    def source(self):
        return (f"NVIDIA DeepLearningExamples {README}, \"{SECTION}\" > \"{self.subsection}\" "
                "(TensorFlow 20.06-py3 NGC container)")

    def precision_name(self, precision_class):
        return "mixed precision" if precision_class == MIXED else self.full_name

    def counts(self, seq):
        return sorted(row.gpus for row in self.rows if row.seq == seq)

    def row(self, seq, gpus):
        return next((row for row in self.rows if row.seq == seq and row.gpus == gpus), None)


def _rows(*values):
    return tuple(Row(g, s, (bm, bf), (am, af), gb, (rm, rf), (wm, wf))
                 for g, s, bm, bf, am, af, gb, rm, rf, wm, wf in values)


# gpus, seq, batch (mixed, full), accumulation (mixed, full), global batch,
# throughput (mixed, full), weak scaling (mixed, full): the README's columns in its order.
DGX1_V100_16GB = Table("DGX-1 (8x V100 16GB)", "V100 16GB", 16,
                       "Pre-training training performance: single-node on DGX-1 16GB", "FP32",
                       _rows((1, 128, 16, 8, 4096, 8192, 65536, 134.34, 39.43, 1.00, 1.00),
                             (4, 128, 16, 8, 1024, 2048, 65536, 449.68, 152.33, 3.35, 3.86),
                             (8, 128, 16, 8, 512, 1024, 65536, 1001.39, 285.79, 7.45, 7.25),
                             (1, 512, 4, 2, 8192, 16384, 32768, 28.72, 9.80, 1.00, 1.00),
                             (4, 512, 4, 2, 2048, 4096, 32768, 109.96, 35.32, 3.83, 3.60),
                             (8, 512, 4, 2, 1024, 2048, 32768, 190.65, 69.53, 6.64, 7.09)))
DGX1_V100_32GB = Table("DGX-1 (8x V100 32GB)", "V100 32GB", 32,
                       "Pre-training training performance: single-node on DGX-1 32GB", "FP32",
                       _rows((1, 128, 64, 32, 1024, 2048, 65536, 168.63, 46.78, 1.00, 1.00),
                             (4, 128, 64, 32, 256, 512, 65536, 730.25, 179.73, 4.33, 3.84),
                             (8, 128, 64, 32, 128, 256, 65536, 1443.05, 357.00, 8.56, 7.63),
                             (1, 512, 8, 8, 4096, 4096, 32768, 31.23, 10.67, 1.00, 1.00),
                             (4, 512, 8, 8, 1024, 1024, 32768, 118.84, 39.55, 3.81, 3.71),
                             (8, 512, 8, 8, 512, 512, 32768, 255.64, 81.42, 8.19, 7.63)))
DGX2_V100_32GB = Table("DGX-2 (16x V100 32GB)", "V100 32GB", 32,
                       "Pre-training training performance: single-node on DGX-2 32GB", "FP32",
                       _rows((1, 128, 64, 32, 1024, 8192, 65536, 188.04, 35.32, 1.00, 1.00),
                             (4, 128, 64, 32, 256, 2048, 65536, 790.89, 193.08, 4.21, 5.47),
                             (8, 128, 64, 32, 128, 1024, 65536, 1556.89, 386.89, 8.28, 10.95),
                             (16, 128, 64, 32, 64, 128, 65536, 3081.69, 761.92, 16.39, 21.57),
                             (1, 512, 8, 8, 4096, 4096, 32768, 35.32, 11.67, 1.00, 1.00),
                             (4, 512, 8, 8, 1024, 1024, 32768, 128.98, 42.84, 3.65, 3.67),
                             (8, 512, 8, 8, 512, 512, 32768, 274.04, 86.78, 7.76, 7.44),
                             (16, 512, 8, 8, 256, 256, 32768, 513.43, 173.26, 14.54, 14.85)))
DGX_A100_40GB = Table("DGX A100 (8x A100 40GB)", "A100 40GB", 40,
                      "Pre-training training performance: single-node on DGX A100 40GB", "TF32",
                      _rows((1, 128, 64, 64, 1024, 1024, 65536, 356.845, 238.10, 1.00, 1.00),
                            (4, 128, 64, 64, 256, 256, 65536, 1422.25, 952.39, 3.99, 4.00),
                            (8, 128, 64, 64, 128, 128, 65536, 2871.89, 1889.71, 8.05, 7.94),
                            (1, 512, 16, 8, 2048, 4096, 32768, 70.856, 39.96, 1.00, 1.00),
                            (4, 512, 16, 8, 512, 1024, 32768, 284.912, 160.16, 4.02, 4.01),
                            (8, 512, 16, 8, 256, 512, 32768, 572.112, 316.51, 8.07, 7.92)))
TABLES = (DGX1_V100_16GB, DGX1_V100_32GB, DGX2_V100_32GB, DGX_A100_40GB)
# NVIDIA's phase-1 batch by memory, for GPUs without a table: the published GPUs with the
# most memory first.
BY_MEMORY = (DGX_A100_40GB, DGX1_V100_32GB, DGX1_V100_16GB)


def _memory_gb(name, memory_bytes):
    """The GPU's memory in GB: its name's "40GB" when it says, else `memory_bytes`."""
    said = re.search(r"(\d+)\s*GB", name or "", re.IGNORECASE)
    if said:
        return int(said.group(1))
    return memory_bytes / GIB if memory_bytes else None


# Why there is no figure for GPUs newer than NVIDIA's tables, where a user would look for one.
UNPUBLISHED = {
    "H100": (" (NVIDIA's TensorFlow BERT README stops at the A100, and so do its PyTorch and "
             "TensorFlow 2 BERT READMEs; MLPerf Training publishes its own BERT benchmark's "
             "time to train, from a checkpoint to a target accuracy on packed sequences of "
             "512, not a rate of this recipe)"),
}
UNPUBLISHED["H200"] = UNPUBLISHED["H100"]


def _family(name):
    found = re.search(r"\b(H100|H200)\b", name or "")
    return found.group(1) if found else None


def table_for(name, memory_bytes, gpus=1):
    """(Table or None, note): NVIDIA's table for a GPU named `name` (as TensorFlow or
    nvidia-smi names it; None: a CPU) with `memory_bytes`, on a node of `gpus`; the note
    says why there is no table, or what the match stretches (None for a plain match).
    A100 of any memory: the DGX A100 40GB table (the only A100 one). V100: by memory, 32 GB
    on the DGX-1 table up to 8 GPUs and on the DGX-2 one for more (or an SXM3 V100, the
    DGX-2's)."""
    if not name:
        return None, "NVIDIA publishes no figure for CPU"
    memory = _memory_gb(name, memory_bytes)
    if re.search(r"\bA100\b", name):
        if memory is not None and memory > 48:
            return DGX_A100_40GB, (f"NVIDIA published A100 figures for the A100 40GB only "
                                   f"(DGX A100): this {name} is compared with them")
        return DGX_A100_40GB, None
    if re.search(r"\bV100S?\b", name):
        if memory is None:
            return None, (f"NVIDIA publishes V100 figures for 16 GB and 32 GB; the memory of "
                          f"this {name} is unknown")
        if memory < 24:
            return DGX1_V100_16GB, None
        if gpus > 8 or "SXM3" in name.upper():
            return DGX2_V100_32GB, None
        return DGX1_V100_32GB, None
    return None, f"NVIDIA publishes no figure for {name}{UNPUBLISHED.get(_family(name), '')}"


@dataclasses.dataclass(frozen=True)
class Figure:
    """What a measured rate is compared with: NVIDIA's rate (sequences/s) and weak scaling
    for `gpus`, `how` it was read ("published", or interpolated/scaled from published
    counts: a labelled estimate), the table and the precision column it came from."""
    rate: float
    weak_scaling: float
    gpus: int
    how: str
    table: Table
    precision_class: str
    batch: int

    @property
    def published(self):
        return self.how == "published"


def figure(table, seq, gpus, precision_class):
    """NVIDIA's Figure for `gpus` GPUs at sequence length `seq`, or None when the table has
    no row at that length. A count between two published ones is interpolated linearly
    (rate and weak scaling), one above the largest is scaled linearly from it."""
    column = 0 if precision_class == MIXED else 1
    counts = table.counts(seq)
    if not counts:
        return None
    first = table.row(seq, counts[0])
    batch = first.batch[column]
    exact = table.row(seq, gpus)
    if exact:
        return Figure(exact.rate[column], exact.weak_scaling[column], gpus, "published", table,
                      precision_class, batch)
    below = max((count for count in counts if count < gpus), default=None)
    above = min((count for count in counts if count > gpus), default=None)
    if below is None:
        return None
    low = table.row(seq, below)
    if above is None:
        share = gpus / below
        return Figure(low.rate[column] * share, low.weak_scaling[column] * share, gpus,
                      f"scaled linearly from NVIDIA's {below}-GPU figure", table,
                      precision_class, batch)
    high = table.row(seq, above)
    part = (gpus - below) / (above - below)
    return Figure(low.rate[column] + part * (high.rate[column] - low.rate[column]),
                  low.weak_scaling[column] + part * (high.weak_scaling[column]
                                                     - low.weak_scaling[column]),
                  gpus, f"interpolated between NVIDIA's {below}- and {above}-GPU figures",
                  table, precision_class, batch)


PHASE1_SEQ, PHASE2_SEQ = 128, 512
PHASE_PREDICTIONS = {PHASE1_SEQ: 20, PHASE2_SEQ: 80}   # NVIDIA's max_predictions_per_seq
CPU_BATCH = {PHASE1_SEQ: 8, PHASE2_SEQ: 2}
# Below 16 GB: half of NVIDIA's 16 GB batch (mixed, full) at each sequence length.
SMALL_GPU_BATCH = {PHASE1_SEQ: (8, 4), PHASE2_SEQ: (2, 1)}
PHASE_OF = {PHASE1_SEQ: "phase-1", PHASE2_SEQ: "phase-2"}


def phase_batch(name, memory_bytes, precision, seq=PHASE1_SEQ):
    """(per-GPU batch, why): NVIDIA's batch at sequence length `seq` (128: phase 1, 512:
    phase 2) for this GPU's table and `precision` ("fp16" ...); a GPU without a table takes
    the batch of the published GPU with the most memory that does not exceed its own (so the
    batch follows the memory, which `runtime.devices` reads from the driver); a CPU (`name`
    None) takes CPU_BATCH."""
    precision_class = PRECISION_CLASS[precision]
    column = 0 if precision_class == MIXED else 1
    phase = PHASE_OF[seq]
    if not name:
        return CPU_BATCH[seq], "our choice for a CPU: NVIDIA publishes no CPU batch"
    table, _ = table_for(name, memory_bytes)
    if table is not None:
        return (table.row(seq, 1).batch[column],
                f"NVIDIA's {phase} batch for the {table.gpu}, "
                f"{table.precision_name(precision_class)}")
    memory = _memory_gb(name, memory_bytes)
    for table in BY_MEMORY:
        if memory is not None and memory >= 0.9 * table.memory_gb:
            return (table.row(seq, 1).batch[column],
                    f"NVIDIA's {phase} batch for the {table.gpu} "
                    f"({table.precision_name(precision_class)}), the published GPU of the "
                    f"most memory up to this one's {memory:.0f} GB")
    if memory is None:
        return SMALL_GPU_BATCH[seq][column], ("our choice for a GPU of unknown memory (half "
                                              "NVIDIA's 16 GB batch)")
    return SMALL_GPU_BATCH[seq][column], ("our choice for a GPU under 16 GB (half NVIDIA's "
                                          "16 GB batch)")


def phase1_batch(name, memory_bytes, precision):
    """NVIDIA's phase-1 batch (`phase_batch` at sequence length 128)."""
    return phase_batch(name, memory_bytes, precision, PHASE1_SEQ)
