"""The errors the data preparation raises for bad input or a bad environment.

Every data-preparation module (pre-training records, text formatting, sharding, downloads,
``bertPrep.py``'s actions) reports a missing or unreadable file, invalid input or an
unwritable output as one ``DataPrepError``, whose message is one line ``<file>: <problem>``:
the commands print it as ``error: <file>: <problem>`` instead of a traceback. It lives apart
from all of them so that each can raise it without importing another's code; so does
``DownloadError``, which both the fetching (``data_prep.bertprep.fetcher``) and the unpacking
(``data_prep.bertprep.archives``) raise.
"""


class DataPrepError(Exception):
    """Bad input or environment; ``str(err)`` is one line ``<file>: <problem>``."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem

    def __reduce__(self):
        # Rebuilt from both arguments when sent back from a worker process.
        return type(self), (self.path, self.problem)


class DownloadError(DataPrepError):
    """A download or extraction that cannot succeed; ``str()`` is ``<file or url>: <problem>``."""
