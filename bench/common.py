"""Helpers shared by every benchmark process, in either virtualenv.

Only the standard library and psycopg are imported here: this module runs in
the project's .venv (soniq_django, the raw ceiling, the orchestrator) and in
bench/.venv-peers (django-tasks-db, procrastinate, pgqueuer).

Handlers call ``stamp()`` when they start; each process writes its stamps to
``$BENCH_STAMPS_DIR/<pid>.json`` at exit, and the orchestrator reads them to
compute drain rates and latencies the same way for every system.
"""

import atexit
import ipaddress
import json
import os
import statistics
import sys
import threading
import time

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
RESULT_PREFIX = "BENCH_RESULT "


# Where the benchmarks may run ----------------------------------------------


def base_url() -> str:
    """The maintenance database URL: BENCH_DATABASE_URL, else the local server."""
    return os.environ.get("BENCH_DATABASE_URL") or DEFAULT_URL


def _is_local(host: str | None) -> bool:
    if not host or host.startswith("/") or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def conninfo(dbname: str | None = None) -> dict:
    """Connection parameters for ``dbname`` on the benchmark server (loopback only)."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(base_url())
    for host in str(params.get("host") or "").split(","):
        if not _is_local(host or None):
            raise SystemExit(
                f"bench: refusing to run against {host!r}: only a local PostgreSQL "
                "(loopback address or Unix socket) may be benchmarked"
            )
    if dbname is not None:
        params["dbname"] = dbname
    return params


def dsn(dbname: str | None = None) -> str:
    from psycopg.conninfo import make_conninfo

    return make_conninfo(**conninfo(dbname))


def django_database(dbname: str) -> dict:
    """A Django DATABASES entry as django-environ builds it from a URL (CONN_MAX_AGE 0)."""
    params = conninfo(dbname)
    max_age = os.environ.get("BENCH_CONN_MAX_AGE", "0")  # "none": persistent connections
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": dbname,
        "USER": params.get("user", ""),
        "PASSWORD": params.get("password", ""),
        "HOST": params.get("host", ""),
        "PORT": str(params.get("port", "")),
        "CONN_MAX_AGE": None if max_age == "none" else int(max_age),
    }


def connect(dbname: str, **kwargs):
    import psycopg

    return psycopg.connect(dsn(dbname), autocommit=True, **kwargs)


def create_database(name: str, template: str | None = None) -> None:
    """(Re)create ``name``, empty or as a copy of ``template`` (which nobody may be using)."""
    with connect("postgres") as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))


def drop_database(name: str) -> None:
    with connect("postgres") as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def quiesce(dbname: str) -> None:
    """Same starting line for every measurement: fresh statistics, no dirty buffers."""
    with connect(dbname) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")


# Stamps --------------------------------------------------------------------

_stamps: list = []
_lock = threading.Lock()


def stamp(key=None) -> None:
    """Record that a handler started now (``key`` pairs it with its enqueue time)."""
    now = time.time()
    _stamps.append(now if key is None else (key, now))


def _write_stamps() -> None:
    folder = os.environ.get("BENCH_STAMPS_DIR")
    if not folder or not _stamps:
        return
    with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as out:
        json.dump(_stamps, out)


atexit.register(_write_stamps)


def read_stamps(folder: str) -> list:
    found: list = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with open(os.path.join(folder, name)) as handle:
                found.extend(json.load(handle))
            os.unlink(os.path.join(folder, name))
    return found


# Results -------------------------------------------------------------------


def emit(**result) -> None:
    """Hand a result to the orchestrator on stdout."""
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()


def parse_result(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    raise RuntimeError("no result in the benchmark process's output")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary(values: list[float]) -> dict:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def timed_loop(count: int, body) -> float:
    """Call ``body(i)`` for i in range(count); return calls per second."""
    started = time.perf_counter()
    for i in range(count):
        body(i)
    return count / (time.perf_counter() - started)
