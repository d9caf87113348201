"""The jobs' options (`pretraining.options`, `finetuning.options`) and their commands' flags are
one set of names with one set of defaults, and parsed flags become options that say which
values the command line chose (what NVIDIA's GPU-only defaults depend on)."""
import pytest
from absl import flags

from cli.finetuning_flags import define_classifier_flags, define_squad_flags
from cli.flag_options import options_from_flags
from cli.nvidia_flags import GROUP as IGNORED_GROUP
from cli.pretraining_flags import define_flags as define_pretraining_flags
from finetuning.options import ClassifierOptions, SquadOptions
from pretraining.options import PretrainingOptions
from runtime.speed_defaults import resolve

COMMANDS = [(define_pretraining_flags, PretrainingOptions),
            (define_classifier_flags, ClassifierOptions),
            (define_squad_flags, SquadOptions)]


def parsed(define, argv=()):
    values = flags.FlagValues()
    define(values)
    values(["command", *argv])
    return values


def job_flags(values):
    """The command's own flags: grouped, not absl's, not NVIDIA's ignored ones."""
    return {name: values[name] for name in values
            if values[name].name == name and getattr(values[name], "help_group", None)
            and values[name].help_group != IGNORED_GROUP}


@pytest.mark.parametrize("define, options_class", COMMANDS,
                         ids=[options.__name__ for _, options in COMMANDS])
def test_every_flag_is_an_option_with_the_same_default(define, options_class):
    own = job_flags(parsed(define))
    assert sorted(own) == sorted(options_class.names())
    defaults = options_class()
    mismatched = {name: (flag.default, getattr(defaults, name)) for name, flag in own.items()
                  if flag.default != getattr(defaults, name)}
    assert not mismatched


def test_the_two_finetuning_commands_keep_nvidias_different_defaults():
    squad, glue = SquadOptions(), ClassifierOptions()
    assert (squad.max_seq_length, squad.learning_rate, squad.train_batch_size,
            squad.save_checkpoints_steps, squad.optimizer_type) == (384, 5e-6, 8, 5000, "adam")
    assert (glue.max_seq_length, glue.learning_rate, glue.train_batch_size,
            glue.save_checkpoints_steps) == (128, 5e-5, 32, 1000)
    # not NVIDIA's lamb: at fine-tuning rates it learns nothing (README, test_glue_learns.py)
    assert glue.optimizer_type == "adam"


def test_parsed_flags_become_options_that_know_what_was_chosen():
    options = options_from_flags(
        parsed(define_pretraining_flags, ["--max_seq_length=128", "--amp", "--horovod"]),
        PretrainingOptions)
    assert isinstance(options, PretrainingOptions)
    assert (options.max_seq_length, options.amp, options.horovod) == (128, True, True)
    assert options.given == {"max_seq_length", "amp", "horovod"}
    # NVIDIA's --amp is for GPUs: off without one unless chosen, as on the command line
    assert resolve(options, gpu=False).amp
    left = options_from_flags(parsed(define_pretraining_flags), PretrainingOptions)
    assert left.given == frozenset() and not resolve(left, gpu=False).amp
    assert resolve(left, gpu=True).amp and resolve(left, gpu=True).use_xla


def test_options_made_in_process_say_what_the_caller_chose():
    chosen = PretrainingOptions.of(amp=True, amp_dtype="bfloat16")
    assert chosen.given == {"amp", "amp_dtype"} and resolve(chosen, gpu=False).amp
    assert not resolve(PretrainingOptions(), gpu=False).amp
    with pytest.raises(TypeError):
        PretrainingOptions.of(no_such_option=1)
