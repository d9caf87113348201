"""`RunOptions`: what a training job is given (a command's parsed flags, or a library caller's
own values), and which of those values were chosen rather than left at their defaults.

Why the jobs take this and not absl's flags: a library function that reads the global flag
object cannot be called without faking a command line. Each job states its options as a
dataclass (`pretraining.options`, `finetuning.options`) whose defaults are NVIDIA's; its
command defines its flags from those defaults (`cli/pretraining_flags.py`,
`cli/finetuning_flags.py`) and turns the parsed flags into options (`cli.flag_options`).

Why a record of choices (`given`): NVIDIA's defaults --amp and --use_xla are for GPUs;
without a GPU a run turns them off unless they were asked for (`runtime.speed_defaults`), so
a job must know what was chosen. A command fills `given` from the command line; `of(**values)`
from the values a caller passes.
"""
import dataclasses
from typing import FrozenSet


@dataclasses.dataclass(frozen=True)
class RunOptions:
    given: FrozenSet[str] = dataclasses.field(default=frozenset(), kw_only=True)

    @classmethod
    def of(cls, **values):
        """Options with `values` chosen and everything else at its default."""
        return cls(**values, given=frozenset(values))

    @classmethod
    def names(cls):
        """The options' names (`given` aside), in the order they are stated."""
        return [field.name for field in dataclasses.fields(cls) if field.name != "given"]
