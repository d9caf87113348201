"""Writing and reading the small files a resumed run reads (its run state): written so that
readers see the old content or the new, never a part, and so that the new content is on the
disk before the name points at it; read so that a damaged one is a problem to report, not a
traceback.

Why fsync: a rename is atomic for readers, but after a crash or power loss the file system may
have kept the rename and not the data (a zero-length `data_order.json` or input-state marker,
seen after a node lost power). So a local file is written, `fsync`ed, renamed, and its folder
`fsync`ed (the rename itself is then durable). Remote folders (`gs://`, `s3://`) go through
TensorFlow's file API, whose object stores publish a whole object at close: no fsync there.

The temporary name `<path>.tmp-<pid>` is one that every input listing skips and that the next
run's clean-up removes if a kill leaves it behind. TensorFlow is imported only for remote
paths, so TF-free modules (GLUE metrics) can import this one.
"""
import json
import os


def _is_remote(path):
    return "://" in str(path)


def flush_to_disk(paths):
    """fsync the local files `paths` and the folders holding them (remote ones are skipped):
    what another writer (TensorFlow's saver) wrote is on the disk before a marker names it."""
    folders = []
    for path in paths:
        if _is_remote(path):
            continue
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        folder = os.path.dirname(os.path.abspath(path))
        if folder not in folders:
            folders.append(folder)
    for folder in folders:
        _fsync_folder(folder)


def _fsync_folder(folder):
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:  # some file systems refuse fsync on a folder: the data is synced anyway
        pass
    finally:
        os.close(descriptor)


def write_text_atomically(path, text):
    """`text` into `path` through `<path>.tmp-<pid>` and a rename (overwriting `path`), the
    data and the rename flushed to disk (local paths)."""
    temporary = f"{path}.tmp-{os.getpid()}"
    if _is_remote(path):
        import tensorflow as tf
        try:
            with tf.io.gfile.GFile(temporary, "w") as writer:
                writer.write(text)
            tf.io.gfile.rename(temporary, path, overwrite=True)
        finally:
            if tf.io.gfile.exists(temporary):
                tf.io.gfile.remove(temporary)
        return
    try:
        with open(temporary, "w", encoding="utf-8") as writer:
            writer.write(text)
            writer.flush()
            os.fsync(writer.fileno())
        os.replace(temporary, path)
        _fsync_folder(os.path.dirname(os.path.abspath(path)))
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def write_json_atomically(path, value):
    """`value` as JSON into `path`, through `write_text_atomically`."""
    write_text_atomically(path, json.dumps(value, indent=1, sort_keys=True) + "\n")


def read_text(path):
    """The text of `path`, or None when it does not exist."""
    if _is_remote(path):
        import tensorflow as tf
        if not tf.io.gfile.exists(path):
            return None
        with tf.io.gfile.GFile(path) as reader:
            return reader.read()
    try:
        with open(path, encoding="utf-8", errors="replace") as reader:
            return reader.read()
    except FileNotFoundError:
        return None


def read_json_object(path):
    """(the JSON object in `path`, None) or (None, problem): problem is None when the file
    does not exist, else what is wrong with it ("empty", "not JSON", "not a JSON object"), for
    the caller's one line saying what it does instead. A damaged run-state file (a crash
    before its data reached the disk, a partial copy) is then treated as a missing one."""
    text = read_text(path)
    if text is None:
        return None, None
    if not text.strip():
        return None, "empty"
    try:
        value = json.loads(text)
    except ValueError:
        return None, "not JSON"
    if not isinstance(value, dict):
        return None, "not a JSON object"
    return value, None
