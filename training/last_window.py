"""A peer lost mid-run: the chief saves the last completed accumulation window before it
stops, so the run goes on from there instead of from the last scheduled checkpoint.

Why the chief can: when a rank dies (its process killed, its node gone), the others run on
through the micro-batches of the window in progress, which need no collective, and fail at
the window's end, in the allreduce of the gradients (Horovod over Gloo: ~40 ms after the
peer's death, an UnknownError). Nothing of the model has changed in that failed run: the
update, the loss scale and the global step are under a `tf.cond` on the global norm of every
allreduced gradient (`optimization.train_op`), so none of them runs unless every allreduce
came back. What the failed window did change is this rank's accumulation state (its
buffers and micro-batch counter) and `micro_step`; put back to the window's start (buffers
and counter zero, `micro_step` at the boundary), the variables are exactly those of the last
completed optimizer step, which every rank held alike. The checkpoint written from them is
resumed exactly by the relaunch on the ranks left (a change of ranks restarts the data order
at its `micro_step`, `resilience.data_order`, as for any resubmission on other ranks).

How, inside the Estimator: when a run raises, the MonitoredSession closes its session
without calling any hook's `end()`, but first it stops its coordinator and joins the threads
registered with it (up to `stop_grace_period_secs`, 120 s). The thread this hook registers
waits for that stop and, when training did not end normally, saves with the session still
open. The global step is checked first: if it moved past the last completed window's, an
update was under way and nothing is saved (one line says so).

Only with more than one rank (one process's failure is its own: its run resumes from its
checkpoints as before) and only on the chief (rank 0: where the Estimator saves; when rank 0
is the rank lost, the run goes on from the last scheduled checkpoint). No input-pipeline
state is saved with it (the pipeline has read past the boundary): a resume on the same ranks
rebuilds the pipeline and skips the records consumed since the data order began (exact,
slower, said in a warning); one on other ranks restarts the data order and skips none.
"""
import os
import threading
import time

import tensorflow as tf
from absl import logging

from reporting.console import SHOW
from resilience.accumulation_state import is_accumulation_state
from resilience.window_boundaries import WindowFollower
from training.train_step import MICRO_STEP_NAME

tf1 = tf.compat.v1

# BERT_PEER_LOSS_SAVE=0 turns the save off (the run then goes on from its last scheduled
# checkpoint, as before; bench/peer_loss.py measures the difference).
SWITCH = "BERT_PEER_LOSS_SAVE"


class LastWindowSaver(tf1.train.SessionRunHook):
    """On the chief of a multi-rank run: a failed run (a peer lost) leaves a checkpoint of the
    last completed optimizer step. `finite_guard`: a `resilience.divergence.FiniteWeightsGuard`
    (non-finite weights are never saved)."""

    def __init__(self, checkpoint_prefix, workers, finite_guard=None):
        self._checkpoint_prefix = checkpoint_prefix
        self._workers = workers
        self._finite_guard = finite_guard
        self._active = (workers.is_chief and workers.size > 1
                        and os.environ.get(SWITCH, "1") != "0")
        self.saved = None   # the checkpoint written after a failure (a prefix), else None

    def begin(self):
        if not self._active:
            return
        self._global_step = tf1.train.get_global_step()
        self._micro_step = next((variable for variable in tf1.global_variables()
                                 if variable.op.name == MICRO_STEP_NAME), None)
        if self._micro_step is None:   # a model_fn without the micro-step: nothing to rewind
            self._active = False
            return
        self._windows = WindowFollower(self._workers.rank)
        self._windows.begin()
        self._boundary_micro_step = tf1.placeholder(tf.int64, [], name="last_window_micro_step")
        rewinds = [self._micro_step.assign(self._boundary_micro_step, read_value=False)]
        rewinds += [variable.assign(tf.zeros_like(variable), read_value=False)
                    for variable in tf1.global_variables()
                    if is_accumulation_state(variable.op.name)]
        self._rewind = tf.group(*rewinds, name="last_window_rewind")
        if self._finite_guard is not None:
            self._finite_guard.build()
        self._ended = False

    def after_create_session(self, session, coord):
        if not self._active:
            return
        self._windows.after_create_session(session)
        savers = tf1.get_collection(tf1.GraphKeys.SAVERS)   # the Scaffold's, built by now
        self._saver = savers[0] if savers else tf1.train.Saver()
        step, micro_step = session.run([self._global_step, self._micro_step])
        # a checkpoint saved mid-window (the end of the data) starts held micro-batches in
        self._boundary = (int(step), int(micro_step) - self._windows.held)
        thread = threading.Thread(target=self._save_when_failed, args=(session, coord),
                                  name="last-window-saver", daemon=True)
        coord.register_thread(thread)
        thread.start()

    def before_run(self, run_context):
        if not self._active:
            return None
        self._closing = self._windows.closes_next_run()
        return tf1.train.SessionRunArgs(self._windows.fetches())

    def after_run(self, run_context, run_values):
        if not self._active:
            return
        if self._windows.after_run(run_values.results, self._closing):
            # Local reads after the window's update (its run is over): the boundary now.
            step, micro_step = run_context.session.run([self._global_step, self._micro_step])
            self._boundary = (int(step), int(micro_step))

    def end(self, session):
        self._ended = True

    def _save_when_failed(self, session, coord):
        coord.wait_for_stop()
        if self._ended:
            return
        step, micro_step = self._boundary
        try:  # a thread of its own: the training graph is not its default
            with session.graph.as_default():
                self._save(session, step, micro_step)
        except Exception as error:  # the failure being reported matters more than this one
            logging.warning("the run failed and its last completed step (%d) could not be "
                            "saved: %s", step, str(error).strip().splitlines()[0] if str(error)
                            else type(error).__name__, extra=SHOW)

    def _save(self, session, step, micro_step):
        """Writes the checkpoint of the last completed step `step` (at `micro_step`), unless
        one is there already or an update was under way."""
        latest = tf1.train.latest_checkpoint(os.path.dirname(self._checkpoint_prefix))
        if latest and int(latest.rsplit("-", 1)[1]) >= step:
            logging.warning("the run failed; its checkpoint of step %d is its last completed "
                            "step: nothing newer to save", step, extra=SHOW)
            return
        now = int(session.run(self._global_step))
        if now != step:
            logging.warning("the run failed while step %d was being applied (global step %d): "
                            "the last completed step is not saved", step + 1, now, extra=SHOW)
            return
        start = time.time()
        session.run(self._rewind, {self._boundary_micro_step: micro_step})
        if self._finite_guard is not None:
            self._finite_guard.check(session, step)
        self.saved = self._saver.save(session, self._checkpoint_prefix, global_step=step)
        logging.warning("the run failed (a rank lost?): saved its last completed step, %d "
                        "(micro_step %d), to %s in %.1f s: the run goes on from there", step,
                        micro_step, self.saved, time.time() - start, extra=SHOW)
