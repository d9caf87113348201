"""Checkpoint names of the training state this package creates.

A checkpoint written during pre-training holds the model's weights and, next to them,
everything the optimizer needs to resume: Adam/LAMB moments, gradient accumulators,
step counters and the loss scale. A loader that initialises a *different* run from
such a checkpoint (phase 2 from phase 1 with a fresh optimizer, fine-tuning from
pre-training) must recognise and skip that state, so the names are fixed here, in one
place, instead of being scattered through the code that creates them.

Per-variable state is named ``<model variable>/<suffix>`` (the same convention as
Google's BERT, whose checkpoints use ``adam_m``/``adam_v``); global counters live
under a few fixed scopes.
"""

# Moments of LAMBOptimizer: ``bert/encoder/.../kernel/lamb_m``.
LAMB_M = "lamb_m"
LAMB_V = "lamb_v"
# LAMB's own update counter (bias correction), ``LAMB/lamb_step`` by default.
LAMB_STEP = "lamb_step"
# Moments of AdamWeightDecayOptimizer, as in Google's checkpoints.
ADAM_M = "adam_m"
ADAM_V = "adam_v"
# The update counter of AdamWeightDecayOptimizer with bias correction (--optimizer_type=adamw).
ADAM_STEP = "adam_step"
# Gradient accumulation buffer of a model variable: ``.../kernel/accum``.
GRAD_ACCUM = "accum"

# Suffixes of optimizer state; ``name.endswith(suffix)`` identifies it.
OPTIMIZER_SLOT_SUFFIXES = tuple("/" + s for s in (LAMB_M, LAMB_V, LAMB_STEP, ADAM_M, ADAM_V,
                                                   ADAM_STEP))

# Scopes of the non-per-variable counters created by the training op.
LOSS_SCALE_SCOPE = "loss_scale"                # loss_scale/{loss_scale,good_steps,skipped_steps}
ACCUMULATION_SCOPE = "gradient_accumulation"   # gradient_accumulation/local_step

# With in-graph towers (runtime.towers) each tower accumulates on its own device: tower 0
# in the variable's ``<var>/accum`` above, tower k >= 1 in
# ``gradient_accumulation/tower_<k>/<var>/accum`` (under ACCUMULATION_SCOPE and ending in
# ``/accum``, so ``is_training_state`` and the weights-only loaders skip it as they skip
# the other buffers).
TOWER_ACCUMULATION_SCOPE = ACCUMULATION_SCOPE + "/tower_{}"

TRAINING_STATE_SUFFIXES = OPTIMIZER_SLOT_SUFFIXES + ("/" + GRAD_ACCUM,)
TRAINING_STATE_SCOPES = (LOSS_SCALE_SCOPE + "/", ACCUMULATION_SCOPE + "/")


def is_training_state(name):
    """True for a checkpoint variable that is optimizer/training state, not model weight.

    ``global_step`` is deliberately *not* included: whether to carry it over is the
    loader's decision (phase 2 continues it, fine-tuning restarts it).
    """
    name = name.split(":")[0]
    return name.endswith(TRAINING_STATE_SUFFIXES) or name.startswith(TRAINING_STATE_SCOPES)
