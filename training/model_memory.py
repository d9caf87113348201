"""Refuses, before anything is built, a model the machine cannot hold.

Every size of a config has a range (`modeling.config.SIZE_LIMITS`), but sizes inside their
ranges can still multiply to more than any machine: a tiny config with `vocab_size` 10**9 is
128 billion parameters, and a run used to find that out by allocating for 37 s and 4.5 GB
before a traceback (or the OOM killer, which says nothing at all). So the jobs compare the
memory the model needs (its parameters x the bytes each takes: weights, gradients and the
optimizer's two moments when training, the weights alone otherwise) with what holds it:
each GPU the process computes on (every GPU holds a whole replica), or the RAM on a CPU
(`runtime.memory`). Beyond it, one line naming the config file, the parameters, the part of
the config that makes most of them, and both figures. Activations come on top of this
figure, so passing the check does not promise the run fits; failing it means it cannot.
"""
from modeling.config import (TRAINING_BYTES_PER_PARAMETER, WEIGHT_BYTES_PER_PARAMETER,
                             ConfigError)
from runtime.memory import usable_memory_bytes


def format_bytes(count):
    """`7.8 GiB`, `1.9 TiB`, `512 MiB`."""
    for unit, size in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} bytes"


def largest_part(config):
    """The part of the config that holds most of its parameters, in words, e.g.
    `vocab_size 1000000000 x hidden_size 128 (word embeddings)`."""
    h = config.hidden_size
    layer = config.parameter_count() - config.replace(num_hidden_layers=1).parameter_count()
    parts = {
        f"vocab_size {config.vocab_size} x hidden_size {h} (word embeddings)":
            config.vocab_size * h,
        f"max_position_embeddings {config.max_position_embeddings} x hidden_size {h} "
        "(position embeddings)": config.max_position_embeddings * h,
        f"type_vocab_size {config.type_vocab_size} x hidden_size {h} "
        "(segment embeddings)": config.type_vocab_size * h,
        f"num_hidden_layers {config.num_hidden_layers} x hidden_size {h} x "
        f"intermediate_size {config.intermediate_size} (the layers)":
            config.num_hidden_layers * layer,
    }
    return max(parts, key=parts.get)


def memory_needed(config, training=True):
    """Bytes the model's weights (and, when `training`, gradients and optimizer moments)
    take, and the words that say what they are."""
    if training:
        return (config.parameter_count() * TRAINING_BYTES_PER_PARAMETER,
                f"to train ({TRAINING_BYTES_PER_PARAMETER} bytes a parameter: weights, "
                "gradients and two optimizer moments, before activations)")
    return (config.parameter_count() * WEIGHT_BYTES_PER_PARAMETER,
            f"for its weights ({WEIGHT_BYTES_PER_PARAMETER} bytes a parameter)")


def check_model_fits(config, config_file, gpus=(), training=True, ram_bytes=None):
    """Raises `ConfigError` in one line when the model of `config` (read from `config_file`)
    needs more memory than the smallest of `gpus` (`runtime.devices.GpuInfo`, those this
    process computes on; where their memory is known) or, without GPUs, than the RAM
    (`ram_bytes`, default `runtime.memory.usable_memory_bytes()`). Unknown memory passes."""
    needed, what = memory_needed(config, training)
    known = [gpu for gpu in gpus if gpu.memory_bytes]
    if known:
        gpu = min(known, key=lambda g: g.memory_bytes)
        available = gpu.memory_bytes
        holder = f"GPU {gpu.index}'s {format_bytes(available)} ({gpu.name})"
    elif gpus:
        return  # GPUs whose memory is not known: nothing to compare with
    else:
        available = usable_memory_bytes() if ram_bytes is None else ram_bytes
        if not available:
            return
        holder = f"this machine's {format_bytes(available)} of RAM"
    if needed > available:
        raise ConfigError(
            f"{config_file}: the model has {config.parameter_count():,} parameters, mostly "
            f"{largest_part(config)}, and needs {format_bytes(needed)} {what}, more than "
            f"{holder}: choose smaller sizes")
