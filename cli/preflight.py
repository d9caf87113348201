"""Preflight of a GPU node before pre-training on it: what TensorFlow sees, Horovod's build,
short loops of both phases (phase 1 on one GPU and on all GPUs, phase 2 on all GPUs) beside
NVIDIA's published speeds, and on request a convergence check.

    bert-preflight                        # BERT-large, fp16, XLA: NVIDIA's recipe
    bert-preflight --loss_steps=300       # and the recipe's loss against fp32's
    bert-preflight --nodes                # in an allocation: the allreduce between nodes
    bert-preflight --model base --precision bf16
    bert-preflight --bert_config_file=my_config.json --train_batch_size=32
    (or: bash scripts/preflight.sh ..., python -m cli.preflight ...)

Prints the GPUs (name, compute capability, memory; where a GPU is expected and none is
seen, why), Horovod's build (NCCL, Gloo, MPI), then for each run the steady-state
sequences/s, NVIDIA's figure for that GPU, phase, precision and GPU count with its source,
the ratio, the peak memory against the GPU's and whether XLA compiled the model's step, and
the scaling efficiency beside NVIDIA's. With --loss_steps, the recipe's precision and XLA
train that many steps against float32 from the same weights on the same batches, judged.
With --nodes (inside a Slurm allocation, or with HOROVOD_LAUNCH_FLAGS naming the hosts), the
recipe's launch instead runs timed allreduces of the model's gradients on every GPU of every
node: the network and the transport NCCL took between nodes, the bus bandwidth beside what
the node's links carry, and the time a window costs beside NVIDIA's phase-1 window; a socket
fall-back where InfiniBand is there is a fall-back (exit 2).
The runs are the project's own pre-training command on synthetic records in a temporary
folder (--work_dir keeps it, with preflight.json, the facts as JSON). The last line says PASS,
or what fell back. Exit status: 0 PASS; 2 something fell back (the CPU without --allow_cpu,
several GPUs without NCCL, XLA not compiled, a rate under half NVIDIA's); 1 a run failed (phase
2 out of memory among them), the recipe's loss trails float32's, or bad input.
"""
import sys

from cli.command import Command
from cli.flag_groups import DISTRIBUTED, MODEL, OUTPUT, PRECISION, TRAINING, binders
from reporting.errors import UsageError


def define_flags(flag_values):
    model, train, speed, dist, out = binders(flag_values, MODEL, TRAINING, PRECISION,
                                             DISTRIBUTED, OUTPUT)
    model.DEFINE_enum("model", "large", ["base", "large"],
                      "The model of the loop (modeling/configs/bert_<model>_config.json); "
                      "NVIDIA's figures are BERT-large's.")
    model.DEFINE_string("bert_config_file", None,
                        "A bert_config.json to use instead of --model.")
    speed.DEFINE_enum("precision", "fp16", ["fp16", "bf16", "tf32", "fp32"],
                      "As NVIDIA's scripts name them: fp16 (AMP), bf16 (AMP, bfloat16), "
                      "tf32 and fp32 (no AMP; TF32 matmuls on Ampere and later).")
    speed.DEFINE_bool("use_xla", True, "Compile with XLA (and check that it compiled).")
    train.DEFINE_integer("train_batch_size", None,
                         "Per-GPU batch (default: NVIDIA's phase-1 batch for the GPU and "
                         "precision; 8 on a CPU).")
    train.DEFINE_integer("num_train_steps", None,
                         "Optimizer steps of each run, the first 2 of them warm-up "
                         "(default: 8 on GPUs, 4 on a CPU).")
    train.DEFINE_integer("num_accumulation_steps", None,
                         "Micro-batches per optimizer step (default: 8 on GPUs, 1 on a CPU).")
    train.DEFINE_bool("phase2", True,
                      "Run the phase-2 loop (sequence length 512, 80 predictions) after phase "
                      "1, where the recipe's memory is tightest.")
    train.DEFINE_integer("train_batch_size_phase2", None,
                         "Per-GPU batch of the phase-2 loop (default: NVIDIA's phase-2 batch "
                         "for the GPU and precision; 2 on a CPU).")
    train.DEFINE_integer("loss_steps", 0,
                         "The convergence check: train this many steps in the recipe's "
                         "precision and XLA and in float32 (TF32 off, no XLA) from the same "
                         "weights on the same batches, and judge the gap (300 takes a few "
                         "minutes on one GPU). 0: no check.")
    dist.DEFINE_bool("allow_cpu", False,
                     "Accept a machine without GPU: PASS (exit 0) when the runs on the CPU "
                     "work. Without it the CPU is a fall-back (exit 2).")
    out.DEFINE_string("work_dir", None,
                      "Folder for the records, each run's logs and dllog, and preflight.json "
                      "(kept, replaced by the next preflight there). BERT-large needs ~12 GB "
                      "free there: a run writes two checkpoints, removed when it ends. "
                      "Default: a temporary folder, removed unless a run failed.")
    dist.DEFINE_bool("nodes", False,
                     "The multi-node check instead of the node's loops: the recipe's launch "
                     "(srun in a Slurm allocation, horovodrun with HOROVOD_LAUNCH_FLAGS) runs "
                     "timed allreduces of the model's gradients on every GPU of every node "
                     "with NCCL_DEBUG=INFO, and the report names the transport between "
                     "nodes and its bus bandwidth.")
    out.DEFINE_string("from_json", None,
                      "Run nothing: print the report of a saved preflight.json (e.g. another "
                      "node's, or with --allow_cpu), with its exit status.")


def _saved_facts(path):
    from pretraining.preflight_report import facts_from_json
    try:
        with open(path, encoding="utf-8") as reader:
            return facts_from_json(reader.read())
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise UsageError(f"--from_json={path}: not a preflight.json ({err})") from None


def _measured_facts(flags):
    from pretraining.preflight import PreflightOptions, run
    return run(PreflightOptions(
        model=flags.model, bert_config_file=flags.bert_config_file, precision=flags.precision,
        use_xla=flags.use_xla, train_batch_size=flags.train_batch_size,
        num_train_steps=flags.num_train_steps,
        num_accumulation_steps=flags.num_accumulation_steps, work_dir=flags.work_dir,
        phase2=flags.phase2, train_batch_size_phase2=flags.train_batch_size_phase2,
        loss_steps=flags.loss_steps))


def _nodes_report(flags):
    """The multi-node check's report: measured, or read back from its nodes.json."""
    import dataclasses
    import json
    import os

    from pretraining.preflight import model_facts
    from pretraining.preflight_nodes import check_from_json, report_nodes, run_nodes
    from runtime import devices
    from runtime.allreduce_bandwidth import gradient_bytes
    if flags.from_json:
        try:
            with open(flags.from_json, encoding="utf-8") as reader:
                check = check_from_json(reader.read())
        except (OSError, UsageError) as err:
            why = getattr(err, "strerror", None) or err
            raise UsageError(f"--from_json={flags.from_json}: {why}") from None
    else:
        _, config, label, _, _ = model_facts(flags.model, flags.bert_config_file)
        wire = "float16" if flags.precision == "fp16" else "float32"  # the recipe's allreduce
        gpus = devices.visible_gpus()
        check = run_nodes(label, flags.precision, gradient_bytes(config, wire),
                          gpus[0] if gpus else None, flags.work_dir, allow_cpu=flags.allow_cpu)
        if flags.work_dir:
            with open(os.path.join(flags.work_dir, "nodes.json"), "w", encoding="utf-8") as out:
                json.dump(dataclasses.asdict(check), out, indent=1)
    return report_nodes(check, allow_cpu=flags.allow_cpu)


def main(flags):
    from pretraining.preflight_report import report
    try:
        if flags.nodes:
            result = _nodes_report(flags)
            print(result.text, flush=True)
            return result.status
        facts = _saved_facts(flags.from_json) if flags.from_json else _measured_facts(flags)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    result = report(facts, allow_cpu=flags.allow_cpu)
    print(result.text, flush=True)
    return result.status


COMMAND = Command("preflight", __doc__, define_flags, main,
                  log_folder=lambda flags: flags.work_dir)

if __name__ == "__main__":
    COMMAND.run()
