"""Flags defined in named groups, and the `--help` that lists them by group.

absl's own `--help` lists only flags defined in the `__main__` module (none, for our
commands: they define theirs in packages, and console scripts have a generated `__main__`),
and `--helpfull` lists them by defining module among absl's own. So each flag is defined
through `bind(flag_values, group)`, which records its group on the flag, and `grouped_help`
prints the command's flags group by group; `--helpfull` still lists everything.
"""
from absl import flags

INPUT = "Input"
MODEL = "Model"
TRAINING = "Training"
PRECISION = "Precision & speed"
DISTRIBUTED = "Distributed"
OUTPUT = "Output"
# Groups in this order first; others (a command's own) after them, as first defined.
ORDER = (INPUT, MODEL, TRAINING, PRECISION, DISTRIBUTED, OUTPUT)

# --start_over, the same for every training command (NVIDIA has no such flag)
START_OVER_HELP = (
    "Start at step 0 in an --output_dir that holds checkpoints: they, its 'checkpoint' file, "
    "data_order.json and input_state/ are moved into <output_dir>/set_aside-<time>/ (nothing "
    "is deleted). Without it a run resumes from its latest checkpoint (when that one is lost, "
    "damaged or holds a NaN, from the newest usable one) and refuses to start at step 0 over "
    "checkpoints none of which is usable.")

CONSOLE_HELP = """\
Console:
  -v, --verbosity=INT
      Show everything TensorFlow and absl log (0: INFO, 1: DEBUG, -1: WARNING), as
      BERT_VERBOSE=1 in the environment does. Default: only this command's progress,
      results, warnings and errors; the log file keeps every log record.
  --log_dir=DIR
      Write the log file <command>.log here (default: the command's output folder, if it
      has one).
  --helpfull
      Every flag, absl's included, by defining module.
"""


def bind(flag_values, group):
    """An object whose DEFINE_* functions define on `flag_values`, in help group `group`."""
    class _Bound:
        def __getattr__(self, name):
            define = getattr(flags, name)

            def define_in_group(*args, **kwargs):
                holder = define(*args, flag_values=flag_values, **kwargs)
                flag_values[holder.name].help_group = group
                return holder
            return define_in_group
    return _Bound()


def binders(flag_values, *groups):
    """`bind(flag_values, group)` for each group, in order."""
    return [bind(flag_values, group) for group in groups]


def _value_hint(flag):
    enum_values = getattr(flag.parser, "enum_values", None)
    if enum_values:
        return "=" + "|".join(enum_values)
    if flag.boolean:
        return ""
    if flag.name.endswith(("_file", "_dir", "_checkpoint", "_path", "_model", "_repository")):
        return "=PATH"
    return "=" + {"int": "INT", "float": "FLOAT", "list": "A,B,..."}.get(flag.flag_type(), "TEXT")


def _default(flag):
    if flag.default is None or flag.default == "" or flag.default == []:
        return ""
    if flag.boolean:
        return " (default: true)" if flag.default else ""
    value = ",".join(map(str, flag.default)) if isinstance(flag.default, list) else flag.default
    return f" (default: {value})"


def grouped_help(doc, flag_values=flags.FLAGS, required=()):
    """`doc`, then every grouped flag of `flag_values` under its group's heading."""
    groups = {}
    for name in flag_values:
        flag = flag_values[name]
        group = getattr(flag, "help_group", None)
        if flag.name == name and group:
            groups.setdefault(group, []).append(flag)
    order = [g for g in ORDER if g in groups] + [g for g in groups if g not in ORDER]
    parts = [doc.strip() + "\n"]
    for group in order:
        lines = [f"{group}:"]
        for flag in groups[group]:
            prefix = "--[no]" if flag.boolean else "--"
            lines.append(f"  {prefix}{flag.name}{_value_hint(flag)}")
            note = " (required)" if flag.name in required else _default(flag)
            text = flag.help.split(">: ", 1)[1] if _value_hint(flag).count("|") else flag.help
            lines.append(flags.text_wrap(text + note, length=92, indent="      "))
        parts.append("\n".join(lines) + "\n")
    parts.append(CONSOLE_HELP)
    return "\n".join(parts)
