"""One command: grouped `--help`, absl flag parsing, console and log file, then its `main`.

Every command (`cli/<command>.py`) is a `Command`; its console script (setup.py) and the
top-level script of the same job both call `COMMAND.run()`, which does what all commands
share, in the order it must happen: the console is prepared before TensorFlow is imported
(commands import TensorFlow inside `main`, never at module level).

Two kinds of bad moment are met here once for every command, each in one line:
* a flag value that is not UTF-8 (a folder named with bytes b'out\xff', which Linux allows
  and Python hands over as surrogate escapes): TensorFlow's file functions and the log file
  can only take UTF-8, so it used to end in a logging traceback with the log file's folder
  already created; it is now refused, naming the flag, before anything is created
  (`undecodable_flag`);
* Ctrl-C outside training (training itself saves a checkpoint and stops: the preemption
  hook): `error: interrupted (Ctrl-C)` and exit status 130, instead of a KeyboardInterrupt
  traceback. What a command was writing is not left behind under its final name: each
  writer writes a temporary and renames it when whole, and removes it when interrupted.
"""
import dataclasses
import logging
import os
import sys
from typing import Callable, Optional, Sequence

from absl import app, flags

from cli.flag_groups import grouped_help
from cli.flag_ranges import register_ranges
from reporting import console

HELP_ARGS = ("--help", "-h", "-?", "--helpshort")
INTERRUPTED_STATUS = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C ended


def prepare_process(argv=None):
    """Before anything imports TensorFlow: oneDNN kernels on (`runtime.cpu_kernels`, also
    read once, when TensorFlow starts), then the console (`reporting.console.prepare`)."""
    from runtime.cpu_kernels import enable_onednn
    enable_onednn()
    console.prepare(argv)


def _print_help(text):
    """To stdout; `bert-pretrain --help | head` is not an error (absl's --help does the same)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@dataclasses.dataclass(frozen=True)
class Command:
    """name: the log file's name (`<name>.log`); doc: the text `--help` starts with;
    define_flags(flag_values); main(flag_values) -> exit status;
    log_folder(flag_values) -> the folder of the log file (None: no log file unless
    --log_dir); console_level: the lowest level of the command's own log records shown on
    the console (INFO for a command whose INFO lines are its output);
    exit_without_teardown: run from its command line, end the process as soon as `main`
    returns, once the output streams and log handlers are flushed, instead of freeing every
    object first (for a command that is over in a second and leaves large data behind:
    teardown was 6% of `create_pretraining_data` on a 3.5 MB shard);
    interrupted_note: what the line after Ctrl-C adds (what was kept, how to go on)."""
    name: str
    doc: str
    define_flags: Callable
    main: Callable
    required: Sequence[str] = ()
    log_folder: Callable = lambda flag_values: None
    console_level: int = logging.WARNING
    exit_without_teardown: bool = False
    interrupted_note: str = ""

    def run(self, argv: Optional[Sequence[str]] = None):
        """Parses the command line (sys.argv) and runs the command; exits with its status."""
        from_command_line = argv is None  # not a caller in this process, which goes on
        argv = list(sys.argv if argv is None else argv)
        prepare_process(argv)
        self.define_flags(flags.FLAGS)
        register_ranges(flags.FLAGS)  # every numeric flag checked as it is parsed
        if any(arg in HELP_ARGS for arg in argv[1:]):
            _print_help(grouped_help(self.doc, flags.FLAGS, self.required))
            sys.exit(0)
        flags.mark_flags_as_required(list(self.required))

        def main(args):
            if len(args) > 1:
                print(f"error: {args[1]}: unexpected argument", file=sys.stderr)
                return 1
            values = flags.FLAGS
            undecodable = undecodable_flag(values)
            if undecodable:  # before the log file (in --output_dir, often) is created
                print(f"error: {undecodable}", file=sys.stderr)
                return 1
            console.start(self.name, values.log_dir or self.log_folder(values),
                          self.console_level)
            status = self.main(values)
            if self.exit_without_teardown and from_command_line:
                _exit_now(status)
            return status

        try:
            app.run(main, argv=argv, flags_parser=_parse_flags)
        except KeyboardInterrupt:
            note = f": {self.interrupted_note}" if self.interrupted_note else ""
            after_echo = "\n" if sys.stderr.isatty() else ""  # the terminal's ^C ends no line
            print(f"{after_echo}error: {self.name}: interrupted (Ctrl-C){note}",
                  file=sys.stderr)
            if self.exit_without_teardown and from_command_line:
                _exit_now(INTERRUPTED_STATUS)
            sys.exit(INTERRUPTED_STATUS)


def undecodable_flag(flag_values):
    """`flag --NAME: b'...' is not UTF-8 ...` for the first flag whose value (or one of a list
    flag's values) holds bytes that are not UTF-8, or None."""
    for name in flag_values:
        flag = flag_values[name]
        if flag.name != name:  # a short name of another flag
            continue
        values = flag.value if isinstance(flag.value, (list, tuple)) else [flag.value]
        for value in values:
            if not isinstance(value, str):
                continue
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as err:
                byte = os.fsencode(value[err.start])[0]
                return (f"flag --{name}: {os.fsencode(value)!r} is not UTF-8 (byte 0x{byte:02x} "
                        f"at character {err.start + 1}): TensorFlow's files and the log take "
                        "UTF-8 names and text only")
    return None


def _exit_now(status):
    """Ends the process with `status` (0 for None) at once: log handlers flushed and
    closed, the output streams flushed, no object freed (os._exit skips the interpreter's
    teardown, and with it atexit functions and finalizers; nothing of ours needs them)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a reader that went away
            pass
    os._exit(status or 0)


def _parse_flags(argv):
    """absl's parsing, with a bad flag (unknown, or a value it cannot take) said in one line
    `error: ...` instead of absl's two, and exit status 1 as for every other bad input."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as err:
        print(f"error: {err} (--help lists the flags)", file=sys.stderr)
        sys.exit(1)
