"""Which session runs close an accumulation window, known before each run.

Hooks that agree across Horovod ranks (a scalar allreduce: "was a preemption signal
received?", "how many bad records were skipped?") must fetch that collective in the same runs
on every rank, and should do so as rarely as a decision needs: with
--allreduce_post_accumulation the ranks otherwise meet once a window (128-512 micro-batches
in NVIDIA's recipe), and a collective fetched every micro-batch made every micro-batch a
synchronisation point (at 32+ ranks a scalar allreduce costs ~2(n-1) network latencies plus
Horovod's negotiation, and each meeting waits for the slowest rank's jitter;
bench/preemption_allreduce.py). A run can only stop where a micro-batch closes a window, so
fetching there loses nothing.

`WindowFollower` reads the window's size and the micro-batches already held once, when the
session starts (`WINDOW_COLLECTION`, published by the gradient accumulator), then counts, and
checks its count against the training op's own `is_optimizer_step` (OPTIMIZER_STEP_COLLECTION)
fetched in every run. Every rank restored the same counter, so all ranks follow the same
windows.
"""
import tensorflow as tf
from absl import logging

from optimization.gradient_accumulation import WINDOW_COLLECTION

tf1 = tf.compat.v1

# Graph collection holding the step's `is_optimizer_step` (bool: this micro-batch closed an
# accumulation window), published by the training step (training.train_step).
OPTIMIZER_STEP_COLLECTION = "bert_is_optimizer_step"


class WindowFollower:
    """Call `begin()` in a hook's begin, `after_create_session(session)` in its own, then per
    run `closes_next_run()` / `fetches()` in before_run and `after_run(results)` in
    after_run (results: a dict holding at least what `fetches()` asked for)."""

    def __init__(self, rank=0):
        self._rank = rank
        self._window, self._held = 1, 0

    def begin(self):
        boundary = tf1.get_collection(OPTIMIZER_STEP_COLLECTION)
        # A model_fn without gradient accumulation publishes neither: then every micro-batch
        # is an optimizer step.
        self._boundary = {"boundary": boundary[0]} if boundary else {}
        self._window_tensors = tf1.get_collection(WINDOW_COLLECTION)[:2]
        self._window, self._held = 1, 0

    def after_create_session(self, session):
        # Local reads (no collective).
        if len(self._window_tensors) == 2:
            window, held = session.run(self._window_tensors)
            self._window, self._held = max(1, int(window)), int(held)

    @property
    def held(self):
        """Micro-batches of the window in progress already run (by this follower's count)."""
        return self._held

    def closes_next_run(self):
        """Whether the coming run closes the window (by this follower's count)."""
        return self._held + 1 >= self._window

    def fetches(self):
        """What every run must fetch for the count to follow the training op."""
        return dict(self._boundary)

    def after_run(self, results, expected_to_close):
        """Follows the run just made; returns whether it closed the window (the training
        op's word, when published). `expected_to_close`: what `closes_next_run()` said before
        the run; a drift between the two is logged and the op followed (every rank sees the
        same, so the runs that fetch a collective stay the same)."""
        closed = bool(results.get("boundary", True))
        if closed != expected_to_close:
            logging.warning("rank %d: accumulation window count out of step with the "
                            "training op; following the op", self._rank)
        self._held = 0 if closed else self._held + 1
        return closed
