"""The preflight's convergence check, judged: does the recipe's precision and XLA learn what
float32 learns, from the same weights on the same batches?

Why: a mixed-precision run that does not converge looks healthy for hours (the loss moves,
the rate is high). NVIDIA's own script warns that XLA with manual float16 "may prevent
convergence", and a float16 run can stall on a loss scale or on an overflow in an XLA fusion.
The preflight trains twice for a few hundred steps (`pretraining.preflight_loss`): the
recipe (its precision, its XLA) and a reference in float32 without XLA (on GPUs with TF32
off: NVIDIA_TF32_OVERRIDE=0), both from one initial checkpoint, on the same records in the
same order, with the same dropout masks (they are keyed by the step). Any difference is the
arithmetic's.

The verdict compares where the two curves end with how far the reference travelled:
`progress` is the reference's loss at the start (mean of its first `EDGE` of steps) minus
its loss at the end (mean of its last `EDGE`), `gap` is the recipe's end minus the
reference's end. The recipe passes when `gap <= GAP_LIMIT x progress`: it learned at least
90% of what float32 learned in the same steps (a recipe ahead of float32 passes). When the
reference itself learned less than `MIN_PROGRESS` of its starting loss the check cannot
tell and says so (give more steps). A recipe run that fails, or whose loss is not finite,
fails the check. The curves are the masked-LM loss (the next-sentence task of synthetic
records has nothing to learn).
"""
import dataclasses
import math
from typing import Optional, Tuple

GAP_LIMIT = 0.10      # the recipe may trail float32 by 10% of what float32 learned
MIN_PROGRESS = 0.05   # the reference must learn 5% of its starting loss for a verdict
EDGE = 0.1            # the share of steps averaged at each end (at least MIN_EDGE_STEPS)
MIN_EDGE_STEPS = 5

PASSED, INCONCLUSIVE, FAILED = "passed", "inconclusive", "failed"


@dataclasses.dataclass(frozen=True)
class LossCheck:
    """The two runs of the check: per-step masked-LM losses (None where a step logged none),
    float16 steps skipped by the loss scale, or why a run failed."""
    steps: int
    batch: int
    devices: str                     # where both ran: "1 GPU", "CPU"
    recipe: str                      # "fp16, XLA"
    reference: str                   # "fp32 (TF32 off), no XLA"
    recipe_losses: Tuple[Optional[float], ...] = ()
    reference_losses: Tuple[Optional[float], ...] = ()
    recipe_skipped: int = 0
    failure: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Verdict:
    outcome: str                     # PASSED | INCONCLUSIVE | FAILED
    line: str                        # what the report prints
    start: Optional[float] = None    # the reference's starting loss
    reference_end: Optional[float] = None
    recipe_end: Optional[float] = None
    gap_share: Optional[float] = None  # gap / progress


def _edge_mean(losses, last):
    """Mean of the first (or last) EDGE of the finite losses; None when there are none."""
    values = [value for value in losses if value is not None]
    if not values:
        return None
    count = min(len(values), max(MIN_EDGE_STEPS, int(round(len(values) * EDGE))))
    chosen = values[-count:] if last else values[:count]
    return sum(chosen) / len(chosen)


def judge(check):
    """The check's Verdict (module docstring)."""
    what = (f"loss check, {check.steps} steps of {check.batch} sequences on {check.devices} "
            f"from the same weights and batches: {check.recipe} against {check.reference}")
    if check.failure:
        return Verdict(FAILED, f"{what}: {check.failure}")
    broken = [value for value in check.recipe_losses
              if value is not None and not math.isfinite(value)]
    if broken:
        return Verdict(FAILED, f"{what}: the {check.recipe} run's loss became {broken[0]}")
    start = _edge_mean(check.reference_losses, last=False)
    reference_end = _edge_mean(check.reference_losses, last=True)
    recipe_end = _edge_mean(check.recipe_losses, last=True)
    if None in (start, reference_end, recipe_end):
        return Verdict(FAILED, f"{what}: a run logged no loss")
    progress = start - reference_end
    skipped = (f"; {check.recipe_skipped} step{'s' * (check.recipe_skipped != 1)} skipped by "
               "the loss scale" if check.recipe_skipped else "")
    ends = (f"masked-LM loss {start:.3f} -> {reference_end:.3f} in {check.reference}, "
            f"-> {recipe_end:.3f} in {check.recipe}{skipped}")
    if progress < MIN_PROGRESS * start:
        return Verdict(INCONCLUSIVE, f"{what}: {ends}; the reference learned too little to "
                                     f"judge (under {MIN_PROGRESS:.0%} of its starting loss): "
                                     "give more --loss_steps", start, reference_end, recipe_end)
    gap = recipe_end - reference_end
    share = gap / progress
    judged = (f"{what}: {ends}: the recipe trails by {max(share, 0.0):.1%} of what float32 "
              f"learned (limit {GAP_LIMIT:.0%})")
    outcome = PASSED if share <= GAP_LIMIT else FAILED
    return Verdict(outcome, judged, start, reference_end, recipe_end, share)
