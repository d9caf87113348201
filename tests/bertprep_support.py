"""Helpers shared by the tests of bertPrep.py: a local HTTP server with Range requests and
fault injection, running the command line, and corpora built once per test session."""
import atexit
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIKI_DUMP = "wiki/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
TABLE_DUMP = "wiki/enwiki-table-markup.xml.bz2"
BOOKS = ("books/pg11_alice_in_wonderland.txt", "books/pg1342_pride_and_prejudice.txt")


class FixtureServer:
    """Serves in-memory files on 127.0.0.1 (HTTP/1.0, Range requests honoured).

    ``faults[path]`` is a list consumed one entry per request: ``("status", 503)`` answers
    with that status; ``("cut", n)`` sends the headers of a full answer, then only ``n`` bytes
    of the body, then closes the connection; ``("slow", s)`` sends the body over s seconds.  ``log`` records ``(path, range header, status)``.
    """

    def __init__(self):
        self.files = {}
        self.faults = {}
        self.log = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_GET(self):
                path = self.path.split("?")[0]
                rng = self.headers.get("Range")
                data = server.files.get(path)
                if data is None:
                    return self._status(path, rng, 404)
                faults = server.faults.get(path) or []
                fault = faults.pop(0) if faults else None
                if fault and fault[0] == "status":
                    return self._status(path, rng, fault[1])
                start = 0
                if rng:
                    m = re.fullmatch(r"bytes=(\d+)-", rng)
                    start = int(m.group(1))
                    if start >= len(data):
                        server.log.append((path, rng, 416))
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                body = data[start:]
                status = 206 if rng else 200
                server.log.append((path, rng, status))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                if rng:
                    self.send_header("Content-Range",
                                     f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if fault and fault[0] == "slow":  # the body in 10 pieces over n seconds
                    step = max(1, len(body) // 10)
                    for offset in range(0, len(body), step):
                        self.wfile.write(body[offset:offset + step])
                        self.wfile.flush()
                        time.sleep(fault[1] / 10)
                    return
                if fault and fault[0] == "cut":
                    self.wfile.write(body[:fault[1]])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self.wfile.write(body)

            def _status(self, path, rng, code):
                server.log.append((path, rng, code))
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    def url(self, path):
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def run_bertprep(args, env=None, timeout=300, **kwargs):
    """``python bertPrep.py args`` in a child process; returns the CompletedProcess."""
    full_env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    full_env.pop("BERT_PREP_WORKING_DIR", None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, os.path.join(REPO, "bertPrep.py")] + list(args),
                          capture_output=True, text=True, env=full_env, timeout=timeout,
                          cwd=REPO, **kwargs)


def assert_clean_error(proc, *fragments):
    """Non-zero exit, stderr ends in one ``error: ...`` line containing ``fragments``."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


_CACHE = {}


def formatted_corpus(shared_data):
    """A working dir with ``wikicorpus_en`` and ``bookscorpus`` formatted (built once per
    session); returns (working dir, {dataset: FormattingStats})."""
    if "formatted" not in _CACHE:
        from data_prep.bertprep import text_formatting as tf
        from data_prep.bertprep.prep_layout import Layout
        root = tempfile.mkdtemp(prefix="bertprep-formatted-")
        atexit.register(shutil.rmtree, root, True)
        layout = Layout(root)
        stats = {
            "wikicorpus_en": tf.format_wikipedia([os.path.join(shared_data, WIKI_DUMP)],
                                                 layout.formatted_file("wikicorpus_en"),
                                                 progress=False),
            "bookscorpus": tf.format_books([os.path.join(shared_data, "books")],
                                           layout.formatted_file("bookscorpus"),
                                           progress=False),
        }
        _CACHE["formatted"] = root, stats
    return _CACHE["formatted"]


def copy_working_dir(source, dest):
    shutil.copytree(source, dest, symlinks=True)
    return dest
