"""What a command prints on the console, and the log file that keeps everything.

Why: a run printed ~500 lines (TensorFlow's deprecation notices, absl and Estimator INFO
lines) around the ~25 that matter. So by default a command's console shows only its own
progress, results, warnings and errors:
  * TensorFlow's C++ logging stops below errors: TF_CPP_MIN_LOG_LEVEL=2 unless the environment
    sets it (`prepare`, called before TensorFlow is imported: commands import it lazily);
  * Python logging below ERROR from TensorFlow, Keras, the Estimator and `warnings` is left
    out, and so is our own INFO (a command that wants its INFO lines says so);
  * a record logged with `extra=SHOW` is shown anyway: one call puts a line the user should
    see (the plan, the training summary) on the console and in the log file.
`-v N`/`--verbosity N` (absl's own flag: 0 INFO, 1 DEBUG, -1 WARNING) or BERT_VERBOSE=1 gives
the whole story back on the console, as absl and TensorFlow print it.

The log file (`<folder>/<command>.log`, appended, `.rank<N>` before `.log` for Horovod ranks
other than 0) gets every Python log record at INFO or above, TensorFlow's included, with
absl's time-stamped prefix. C++ log lines (written by TensorFlow straight to file descriptor
2): TensorFlow's own are not produced when quiet; those that are (XLA's, through absl's C++
logging, which ignores TF_CPP_MIN_LOG_LEVEL) go to the log file, not the console
(`reporting.native_log`), but errors that are not known to be harmless, which go to both.
"""
import importlib.util
import logging
import os
import sys

VERBOSE_ENV = "BERT_VERBOSE"
# logging.info(..., extra=SHOW): a line of the command's own output (console and log file).
SHOW = {"show": True}
# Packages whose Python log records are chatter unless they are errors.
_CHATTY_PACKAGES = ("tensorflow", "tensorflow_estimator", "keras", "tf_keras",
                    "tensorflow_addons", "h5py")
_CHATTY_LOGGERS = ("tensorflow", "py.warnings", "h5py")
_RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def _env_verbose():
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def verbosity_in_argv(argv):
    """Whether the command line asks for absl's -v/--verbosity (before flags are parsed)."""
    return any(arg in ("-v", "--verbosity") or arg.startswith(("-v=", "--verbosity="))
               for arg in argv[1:])


def prepare(argv=None):
    """Before anything imports TensorFlow: the C++ log level, and absl's handler on the root
    logger (TensorFlow adds a handler of its own when the root logger has none, which
    printed each of its records a second time). A command also turns oneDNN on at this
    moment (`cli.command.prepare_process`)."""
    from absl import logging as absl_logging

    argv = sys.argv if argv is None else argv
    if not (_env_verbose() or verbosity_in_argv(argv)):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.captureWarnings(True)
    absl_logging.use_absl_handler()


def _package_dirs():
    dirs = []
    for name in _CHATTY_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        for location in (spec.submodule_search_locations or []) if spec else []:
            dirs.append(os.path.join(os.path.realpath(location), ""))
    return tuple(dirs)


class QuietConsole(logging.Filter):
    """Lets through errors, SHOW records, and our own records at `own_level` and above."""

    def __init__(self, own_level=logging.WARNING):
        super().__init__()
        self._own_level = own_level
        self._chatty_dirs = _package_dirs()

    def _chatty(self, record):
        return (record.name.split(".")[0] in _CHATTY_LOGGERS
                or os.path.realpath(record.pathname).startswith(self._chatty_dirs))

    def filter(self, record):
        if record.levelno >= logging.ERROR or getattr(record, "show", False):
            return True
        return record.levelno >= self._own_level and not self._chatty(record)


class ConsoleFormatter(logging.Formatter):
    """The message alone for INFO, `warning: ...` for warnings, `ERROR:<logger>: ...` for
    errors of libraries (never `error: ...`: that one line is the command's own verdict)."""

    def format(self, record):
        text = super().format(record)
        if record.levelno >= logging.ERROR:
            return f"{record.levelname}:{record.name}: {text}"
        if record.levelno >= logging.WARNING:
            return f"warning: {text}"
        return text


def _rank():
    for variable in _RANK_VARIABLES:
        value = os.environ.get(variable, "")
        if value.isdigit():
            return int(value)
    return 0


def log_file_path(folder, command):
    """`<folder>/<command>.log`, or `<command>.rank<N>.log` for rank N > 0."""
    rank = _rank()
    return os.path.join(folder, f"{command}.rank{rank}.log" if rank else f"{command}.log")


def _add_log_file(root, folder, command):
    from absl import logging as absl_logging
    path = log_file_path(folder, command)
    try:
        os.makedirs(folder, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError as err:
        print(f"warning: no log file {path}: {err.strerror or err}", file=sys.stderr)
        return None
    handler.setFormatter(absl_logging.PythonFormatter())
    root.addHandler(handler)
    return path


def start(command, log_folder=None, own_level=logging.WARNING):
    """After flags are parsed: the console's filter (unless verbose) and the log file.
    Returns the log file's path (None without one)."""
    from absl import flags
    from absl import logging as absl_logging
    verbose = _env_verbose() or (flags.FLAGS.is_parsed() and flags.FLAGS["verbosity"].present)
    root = logging.getLogger()
    absl_handler = absl_logging.get_absl_handler()
    tf_logger = logging.getLogger("tensorflow")
    for handler in list(tf_logger.handlers):  # TensorFlow imported before `prepare`
        tf_logger.removeHandler(handler)
    if verbose:
        # absl set the root level from --verbosity; the log file still gets INFO.
        absl_handler.setLevel(root.getEffectiveLevel())
    else:
        if log_folder and "://" not in log_folder:
            # before the console handler: it must hold the console's own descriptor
            from reporting.native_log import route
            route(log_file_path(log_folder, command))
        root.removeHandler(absl_handler)
        console = logging.StreamHandler(sys.stderr)
        console.addFilter(QuietConsole(own_level))
        console.setFormatter(ConsoleFormatter())
        root.addHandler(console)
    root.setLevel(min(root.getEffectiveLevel(), logging.INFO))
    path = None
    if log_folder and "://" not in log_folder:
        path = _add_log_file(root, log_folder, command)
    if path:
        absl_logging.info("%s started: %s", command, " ".join(sys.argv))
    return path
