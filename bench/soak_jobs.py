"""The soak run's job (bench/soak.py), imported by the workers through SONIQ["IMPORTS"].

``bench.soak`` gets the producer's wall-clock time from just before its
enqueue call as ``t``; the handler appends "enqueue-time start-time" to
``$SOAK_STAMPS_DIR/<pid>.txt`` at once (one ``write`` to an O_APPEND file, so
the lines of the worker's threads never mix), where the orchestrator reads
them every minute.
"""

import os
import threading
import time

from soniq_django import job

_lock = threading.Lock()
_fd: int | None = None


def _out() -> int:
    global _fd
    with _lock:
        if _fd is None:
            path = os.path.join(os.environ["SOAK_STAMPS_DIR"], f"{os.getpid()}.txt")
            _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return _fd


@job(name="bench.soak")
def soak(t: float) -> None:
    started = time.time()
    os.write(_out(), b"%.6f %.6f\n" % (t, started))
