"""Session hooks: step logging (log file, JSON lines, a progress line with an ETA on the
console) with throughput and MFU, and checkpoint-on-preemption.

Both are plain `tf.compat.v1.train.SessionRunHook`s so they work under any Estimator.
"""
import json
import os
import signal
import time

import tensorflow as tf
from absl import logging

from reporting.console import SHOW
from reporting.progress import ProgressLine, RunOfRepeats, format_duration
from resilience.window_boundaries import WindowFollower

tf1 = tf.compat.v1


# Values of the optimizer step itself, reported as they are rather than averaged over the
# interval's micro-batches (global_norm is 0 between optimizer steps).
_REPORTED_AS_IS = ("global_step", "is_optimizer_step", "skipped_steps", "loss_scale",
                   "learning_rate", "global_norm")
# Counts of this rank's micro-batch, summed over the interval into rates (see the class).
INSTANCES, REAL_TOKENS = "instances", "real_tokens"
_COUNTED = (INSTANCES, REAL_TOKENS)


class CheckpointWrites:
    """Seconds this process has spent writing checkpoints during training, and how many.

    A checkpoint written every `--save_checkpoints_steps` lands inside a step interval of
    `StepLoggingHook`; a run whose interval held a write would report that write as slow
    steps. The write is timed exactly (`timers()`: two saving listeners around the others,
    `training.resume`), and the hook takes it out of its steady-state rate and reports it as a
    one-time cost of its own. One clock per process (`CHECKPOINT_WRITES`): the listeners and
    the hook are built in different places and never see each other."""

    def __init__(self):
        self.seconds = 0.0
        self.count = 0
        self._started = None

    def timers(self):
        """(first, last) listeners: put `first` before every other saving listener and
        `last` after them, so the time includes their checks (disk space, input state)."""
        clock = self

        class _Start(tf1.train.CheckpointSaverListener):
            def before_save(self, session, global_step_value):
                clock._started = time.time()

        class _Stop(tf1.train.CheckpointSaverListener):
            def after_save(self, session, global_step_value):
                if clock._started is not None:
                    clock.seconds += time.time() - clock._started
                    clock.count += 1
                    clock._started = None

        return _Start(), _Stop()


CHECKPOINT_WRITES = CheckpointWrites()


def process_start_time():
    """Unix time at which this process started (Linux: /proc), or None where unknown: the
    start-up cost of a run counts from there (imports, graph building included)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as reader:
            ticks = int(reader.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat", encoding="ascii") as reader:
            boot = next(int(line.split()[1]) for line in reader if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


_a_job_started = False  # whether a job (a pre-training or fine-tuning run) began here


def job_start_time():
    """When the calling job began, for its start-up cost: this process's start for the first
    job of a process (its imports and TensorFlow's start are that job's), the call itself
    for a later one (the demo runs its phases one after another in one process, and a phase
    did not wait for the ones before it)."""
    global _a_job_started
    now, first = time.time(), not _a_job_started
    _a_job_started = True
    return (process_start_time() or now) if first else now


def peak_memory():
    """(bytes, of what) at the end of a run, for the summary (`bert-preflight` compares runs
    by it): the peak of GPU:0's allocator where this process has a GPU (the allocator its
    sessions share with the eager context), else the process's maximum resident set
    (Linux reports it in KiB); (None, None) where neither can be read."""
    try:
        if tf.config.list_physical_devices("GPU"):
            return int(tf.config.experimental.get_memory_info("GPU:0")["peak"]), "GPU:0"
    except (ValueError, RuntimeError, tf.errors.OpError):  # the device's stats unavailable
        pass
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process max RSS"
    except (ImportError, OSError):  # not a Unix
        return None, None


class StepLoggingHook(tf1.train.SessionRunHook):
    """Logs every `every_n_steps` optimizer steps (rank 0 only).

    `tensors` are fetched with every micro-batch (scalars, in the same run as the train op,
    as the training op's extras must be) and averaged over the interval. Keys used:
    `global_step` and `is_optimizer_step` (required), any others (losses, learning_rate,
    loss_scale, skipped_steps...) are reported as they are.

    Throughput is sequences per second over all ranks: micro-batches x `global_batch_size`
    (per-rank batch x ranks) / wall time. Packed records hold several sequences (instances)
    a row, and users compare sequences, not rows: when `tensors` has `instances` (this
    rank's instances in the micro-batch), `sequences_per_second` counts them and
    `rows_per_second` the rows (which TFLOP/s and MFU follow: a row costs the same however
    many instances it holds). `real_tokens` (non-padding tokens of the micro-batch) gives
    `real_tokens_per_second`, the rate comparable between packed and unpacked data. Both
    counts are this rank's, times `ranks` (ranks read equal batches of the same kind of
    data, so this is exact for one rank and an estimate for several that costs no
    allreduce).

    The summary's averages are the steady-state rates a long run keeps, which users compare
    with NVIDIA's tables: one-time costs are left out and reported apart (`summary`):
    warm-up, i.e. the first `warmup_logs` intervals and every interval that starts within
    the run's first `warmup_steps` optimizer steps (graph executors are built for each new
    set of fetches — the first step fetches summaries, the second does not —, XLA compiles,
    caches fill); and checkpoint writes during training, timed exactly by
    `CHECKPOINT_WRITES` and subtracted from the interval that held them. The start-up before
    the first step (imports, building, session, restore, the step-0 checkpoint) is counted
    from `started_at` (the runners pass `job_start_time()`; default: this process's start).

    With `total_steps`, each log also shows `step N/total  loss  seq/s  ETA` on the console
    (NVIDIA-style; rewritten in place on a terminal, one line per log otherwise), from the
    same measurements: the ETA is the remaining steps at the average time per step since
    warm-up (the last interval's until then).
    """

    def __init__(self, tensors, every_n_steps, global_batch_size, flops_per_sequence=None,
                 peak_flops=None, dllog_path=None, warmup_logs=1, is_chief=True,
                 total_steps=None, ranks=1, warmup_steps=2, started_at=None):
        self._tensors = tensors
        self._ranks = ranks
        self._every = max(1, int(every_n_steps))
        self._global_batch = global_batch_size
        self._flops_per_sequence = flops_per_sequence
        self._peak_flops = peak_flops
        self._dllog_path = dllog_path
        self._warmup_logs = warmup_logs
        self._warmup_steps = max(0, int(warmup_steps))
        self._started_at = started_at or process_start_time() or time.time()
        self._is_chief = is_chief
        self._total_steps = total_steps
        self.records = []

    def begin(self):
        self._sums, self._count, self._counts = {}, 0, {}
        self._last_time = None
        self._micro_batches = 0
        self._logs = 0
        self._measured_seconds = 0.0
        self._measured = {"sequences": 0.0, "rows": 0.0, REAL_TOKENS: 0.0}
        self._measured_steps = 0
        self._measured_from = self._measured_to = None
        self._overhead = {"warmup_seconds": 0.0, "checkpoint_seconds": 0.0}
        self._all = {"seconds": 0.0, "sequences": 0.0}
        self._checkpoints = 0
        self._first_step = None
        self._first_run_time = None
        self._last_step = None
        self._start = time.time()
        self._last_values = {}
        # the run's last optimizer step and its losses (averaged over its micro-batches), for
        # the summary: the last logged interval ends up to every_n_steps - 1 steps earlier
        self._final_step, self._final_losses = None, {}
        self._step_losses, self._step_micro_batches = {}, 0
        self._held = RunOfRepeats()  # held lines: 81 skips in a row print 8, not 81
        self._progress = ProgressLine() if self._is_chief and self._total_steps else None
        if self._dllog_path and self._is_chief:
            os.makedirs(os.path.dirname(os.path.abspath(self._dllog_path)), exist_ok=True)

    def before_run(self, run_context):
        if self._last_time is None:
            self._last_time = time.time()
            self._writes_mark = (CHECKPOINT_WRITES.seconds, CHECKPOINT_WRITES.count)
            if self._first_run_time is None:
                self._first_run_time = self._last_time
        return tf1.train.SessionRunArgs(self._tensors)

    def after_run(self, run_context, run_values):
        values = run_values.results
        self._micro_batches += 1
        for key, value in values.items():
            if key in _REPORTED_AS_IS:
                continue
            if key in _COUNTED:
                self._counts[key] = self._counts.get(key, 0.0) + float(value)
                continue
            self._sums[key] = self._sums.get(key, 0.0) + float(value)
        self._count += 1
        self._last_values = values
        step = int(values["global_step"])
        self._note_final_step(values, step)
        if self._last_step is None:  # the step this run started from
            self._last_step = step - 1 if values["is_optimizer_step"] else step
            self._first_step = self._last_step
        if values["is_optimizer_step"] and step > self._last_step and self._progress:
            recovered = self._held.end()  # the last held line, if not shown yet
            if recovered:
                self._progress.show(self._held_text(*recovered))
        if values["is_optimizer_step"] and step % self._every == 0:
            if step > self._last_step:
                self._emit(values, step)
            elif self._progress and self._held.shows((values, step)):  # skipped: step held
                self._progress.show(self._held_text(values, step))

    def _note_final_step(self, values, step):
        """Keeps the losses of the latest optimizer step (the mean over its micro-batches)."""
        for key, value in values.items():
            if key.endswith("loss") and key not in _REPORTED_AS_IS:
                self._step_losses[key] = self._step_losses.get(key, 0.0) + float(value)
        self._step_micro_batches += 1
        if values["is_optimizer_step"]:
            self._final_step = step
            self._final_losses = {key: total / self._step_micro_batches
                                  for key, total in self._step_losses.items()}
            self._step_losses, self._step_micro_batches = {}, 0

    def _emit(self, values, step):
        now = time.time()
        written = CHECKPOINT_WRITES.seconds - self._writes_mark[0]
        self._checkpoints += CHECKPOINT_WRITES.count - self._writes_mark[1]
        self._overhead["checkpoint_seconds"] += written
        self._all["seconds"] += now - self._last_time
        seconds = max(now - self._last_time - written, 1e-9)
        rows = self._micro_batches * self._global_batch
        sequences = (self._counts[INSTANCES] * self._ranks if INSTANCES in self._counts
                     else rows)
        record = {"step": step, "timestamp": now}  # unix seconds: curves against wall time
        record.update({k: v / self._count for k, v in self._sums.items()})
        for key in ("learning_rate", "loss_scale", "global_norm", "skipped_steps"):
            if key in values:
                record[key] = float(values[key]) if key != "skipped_steps" else int(values[key])
        record["sequences_per_second"] = sequences / seconds
        if INSTANCES in self._counts:
            record["rows_per_second"] = rows / seconds
        if REAL_TOKENS in self._counts:
            record["real_tokens_per_second"] = \
                self._counts[REAL_TOKENS] * self._ranks / seconds
        if self._flops_per_sequence:  # per row of max_seq_length
            record["tflops"] = rows / seconds * self._flops_per_sequence / 1e12
            if self._peak_flops:
                record["mfu"] = record["tflops"] * 1e12 / self._peak_flops
        self._logs += 1
        steps = max(step - self._last_step, 1)
        self._all["sequences"] += sequences
        warm_up = (self._logs <= self._warmup_logs
                   or self._last_step < self._first_step + self._warmup_steps)
        if warm_up:
            self._overhead["warmup_seconds"] += seconds
        else:
            if self._measured_from is None:
                self._measured_from = self._last_step + 1
            self._measured_to = step
            self._measured_seconds += seconds
            self._measured["sequences"] += sequences
            self._measured["rows"] += rows
            self._measured[REAL_TOKENS] += self._counts.get(REAL_TOKENS, 0.0) * self._ranks
            self._measured_steps += steps
        self.records.append(record)
        if self._is_chief:
            logging.info("step %d: %s", step, ", ".join(
                f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                for k, v in record.items() if k not in ("step", "timestamp")))
            if self._dllog_path:
                with open(self._dllog_path, "a", encoding="utf-8") as writer:
                    writer.write(json.dumps(record) + "\n")
            if self._progress:
                self._progress.show(self._progress_text(record, seconds / steps))
        self._sums, self._count, self._micro_batches, self._counts = {}, 0, 0, {}
        self._last_time, self._last_step = now, step
        self._writes_mark = (CHECKPOINT_WRITES.seconds, CHECKPOINT_WRITES.count)

    def _progress_text(self, record, interval_seconds_per_step):
        """`step 120/1000  loss 7.12  312.4 seq/s  ETA 0:04:12` (packed records: `... seq/s
        98.1 rows/s  ETA ...`)."""
        loss = record.get("total_loss", record.get("loss"))
        return "  ".join([f"step {record['step']}/{self._total_steps}"]
                         + ([f"loss {loss:.4g}"] if loss is not None else [])
                         + [f"{record['sequences_per_second']:.1f} seq/s"]
                         + ([f"{record['rows_per_second']:.1f} rows/s"]
                            if "rows_per_second" in record else [])
                         + [self._eta(record["step"], interval_seconds_per_step)])

    def _eta(self, step, fallback_seconds_per_step=None):
        """`ETA h:mm:ss`: the steps left at the average time per step measured so far (after
        warm-up), else `fallback_seconds_per_step`; `ETA ?` without either."""
        per_step = (self._measured_seconds / self._measured_steps if self._measured_steps
                    else fallback_seconds_per_step)
        left = max(self._total_steps - step, 0)
        return f"ETA {format_duration(left * per_step) if per_step else '?'}"

    def _held_text(self, values, step):
        """`step 120/1000  held: 3 steps skipped (loss scale 512)  ETA 0:04:12`: while float16
        steps are skipped the step does not advance, and neither does the ETA (the skipped
        windows are not counted as steps done)."""
        held = f"held: {int(values.get('skipped_steps', 0))} steps skipped"
        if "loss_scale" in values:
            held += f" (loss scale {float(values['loss_scale']):g})"
        return "  ".join([f"step {step}/{self._total_steps}", held, self._eta(step)])

    def summary(self):
        """Totals of the run: the steady-state averages (`average_*_per_second`, over the
        steps `steady_steps`, checkpoint writes taken out), the rate with every cost in
        (`average_sequences_per_second_with_overhead`, first step to last, as NVIDIA's
        "with overhead"), the one-time costs apart (`startup_seconds`, `warmup_seconds`,
        `checkpoint_seconds` for `checkpoints_written` writes), time, final loss and peak
        memory (`peak_memory`). `final_step` and the losses are those of the run's last optimizer
        step (mean over its micro-batches), whether or not a log ended there."""
        result = {"total_seconds": time.time() - self._start}
        if self._measured_seconds > 0:
            measured = self.records[-1]  # which rates this run reports
            for name, key in (("sequences", "sequences_per_second"),
                              ("rows", "rows_per_second"),
                              (REAL_TOKENS, "real_tokens_per_second")):
                if key in measured:
                    result[f"average_{key}"] = self._measured[name] / self._measured_seconds
            result["steady_steps"] = f"{self._measured_from}-{self._measured_to}"
        if self._all["seconds"] > 0:
            result["average_sequences_per_second_with_overhead"] = (
                self._all["sequences"] / self._all["seconds"])
        if self._first_run_time is not None:
            result["startup_seconds"] = max(self._first_run_time - self._started_at, 0.0)
            result.update(self._overhead)
            result["checkpoints_written"] = self._checkpoints
        if self._final_step is not None:  # the run's last step, not its last log's
            result.update(self._final_losses)
            result["final_step"] = self._final_step
        result["peak_memory_bytes"], result["peak_memory_of"] = peak_memory()
        return result

    def end(self, session):
        if not self._is_chief:
            return
        if self._progress:
            self._progress.close()
        summary = self.summary()
        logging.info("training done: %s", ", ".join(
            f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in summary.items()),
            extra=SHOW)
        if self._dllog_path:
            with open(self._dllog_path, "a", encoding="utf-8") as writer:
                writer.write(json.dumps(dict(summary, event="summary")) + "\n")


class PreemptionHook(tf1.train.SessionRunHook):
    """On SIGTERM or SIGINT (a cluster preempting the job, Ctrl-C): all ranks stop together at
    the end of the current accumulation window, the chief saves a checkpoint, and the
    Estimator returns normally so every process exits 0. Rerunning the same command resumes
    from that checkpoint.

    Why agree and why wait for the window's end: ranks receive the signal at different
    micro-batches (or only some of them receive it), and a rank that stopped alone would
    leave the others blocked in their next allreduce. A checkpoint taken mid-window would
    hold a partial gradient sum (with --allreduce_post_accumulation only rank 0's share of
    it), so a stop can only happen where a micro-batch closes a window. So each rank adds its
    own "signal received" flag (0 or 1) to a scalar allreduce (sum), fetched in the same run
    as the training op, and all ranks stop after the run where that total is positive.

    Why only in the runs that close a window (`resilience.window_boundaries`, which says
    why and how): that is the only place a stop can happen, so a signal seen mid-window stops
    the ranks at the same boundary as a check every micro-batch would, without making every
    micro-batch a synchronisation point. With one worker the flag is just the local one.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, checkpoint_prefix, workers, finite_guard=None):
        """`finite_guard`: a `resilience.divergence.FiniteWeightsGuard`, which refuses the
        save of non-finite weights here as at the Estimator's saves."""
        self._checkpoint_prefix = checkpoint_prefix
        self._workers = workers
        self._finite_guard = finite_guard
        # Not None once preemption is under way for this rank: the signal it received, or
        # 0 when only other ranks received one and this run stopped with them.
        self.received = None
        self.stopped = False      # all ranks agreed and stopped at a window's end
        self._previous = {}
        self._windows = WindowFollower(workers.rank)

    def _handler(self, signum, frame):
        self.received = signum
        logging.warning("received signal %d: stopping at the end of this accumulation "
                        "window, then saving a checkpoint", signum)

    def begin(self):
        self._global_step = tf1.train.get_global_step()
        if self._finite_guard is not None and self._workers.is_chief:
            self._finite_guard.build()
        # A placeholder fed on every run that fetches it, not placeholder_with_default: with
        # an unfed default, TensorFlow's graph optimizer constant-folds the allreduce, i.e.
        # runs the collective while it builds an executor for a new set of fetches. The
        # chief builds executors the other ranks do not (its first run also fetches
        # summaries), so its folded allreduce waited forever for peers that never joined
        # (seen: a hang at the second micro-batch).
        self._local_flag = tf1.placeholder(tf.float32, [], name="preemption_signal")
        self._agreed = self._workers.sum_over_ranks(self._local_flag)
        self._windows.begin()
        self._checking = self._signalled_before = False
        self._waited = 0
        for sig in self.SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread: leave signals alone
                pass

    def after_create_session(self, session, coord):
        self._windows.after_create_session(session)

    def before_run(self, run_context):
        # Only a run that closes the window fetches the allreduce, with the flag as the
        # handler left it before the run.
        self._checking = self._windows.closes_next_run()
        self._signalled_before = self.received is not None
        if not self._checking:
            return tf1.train.SessionRunArgs(self._windows.fetches())
        flag = 0.0 if self.received is None else 1.0
        return tf1.train.SessionRunArgs(dict(self._windows.fetches(), agreed=self._agreed),
                                        feed_dict={self._local_flag: flag})

    def after_run(self, run_context, run_values):
        results = run_values.results
        closed = self._windows.after_run(results, self._checking)
        if not closed:
            if self._signalled_before:
                self._waited += 1   # a micro-batch run to reach the window's end
            return
        if not self._checking or results["agreed"] <= 0:
            return
        self.stopped = True
        if self.received is None:
            self.received = 0
        logging.warning("rank %d: preemption agreed by all ranks; stopping at the end of the "
                        "accumulation window (%d micro-batches after the signal was seen)",
                        self._workers.rank, self._waited)
        run_context.request_stop()

    def end(self, session):
        try:
            if self.stopped and self._workers.is_chief:
                savers = tf1.get_collection(tf1.GraphKeys.SAVERS)
                saver = savers[0] if savers else tf1.train.Saver()
                step = session.run(self._global_step)
                if self._finite_guard is not None:
                    self._finite_guard.check(session, step)
                path = saver.save(session, self._checkpoint_prefix, global_step=step)
                logging.warning("preempted: saved %s", path)
        finally:
            # Only now: a repeated signal during the save must not kill the process.
            for sig, previous in self._previous.items():
                signal.signal(sig, previous)
            self._previous = {}


class WeightsFingerprintHook(tf1.train.SessionRunHook):
    """Logs, on every rank at the end of training, a fingerprint of the trainable weights
    (sum of squares, float64). Under Horovod all ranks must print the same number: a
    cheap check that broadcast and allreduce kept the replicas identical."""

    def __init__(self, rank):
        self._rank = rank
        self.fingerprint = None

    def begin(self):
        self._squares = tf.add_n([tf.reduce_sum(tf.square(tf.cast(v, tf.float64)))
                                  for v in tf1.trainable_variables()])

    def end(self, session):
        self.fingerprint = float(session.run(self._squares))
        logging.info("rank %d weights fingerprint %.12e", self._rank, self.fingerprint,
                     extra=SHOW)
