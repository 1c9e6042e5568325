"""procrastinate's side of the benchmark (bench/.venv-peers).

    python -m bench.peers.procrastinate_bench ACTION [COUNT] [CONCURRENCY]

with BENCH_DB_NAME set. Producers use the synchronous API (``defer`` and
``batch_defer``, through procrastinate's sync psycopg connector), as a Django
view would. The worker is ``App.run_worker`` with ``wait=False`` (exit once
caught up), ``concurrency=N`` and every other option at its default
(listen_notify on, delete_jobs never); the pool of its async psycopg
connector holds max(4, N + 2) connections. Handlers are ``async def``,
procrastinate's native kind (a sync handler would go through a thread).
"""

import os
import random
import sys
import time

from bench.common import emit
from bench.peers.procrastinate_app import app, latency, noop


def main(argv: list[str]) -> None:
    action = argv[0]
    count = int(argv[1]) if len(argv) > 1 else 0

    if action in ("worker", "worker-wait"):  # worker-wait: stay idle, LISTENing (latency)
        concurrency = int(argv[2])
        app.run_worker(concurrency=concurrency, wait=action == "worker-wait")
        emit(ok=True)
        return

    with app.open():
        if action == "migrate":
            app.schema_manager.apply_schema()
            emit(ok=True)
        elif action == "enqueue":
            noop.defer(i=-1)
            started = time.perf_counter()
            for i in range(count):
                noop.defer(i=i)
            emit(rate=count / (time.perf_counter() - started))
        elif action in ("bulk", "preload"):
            if action == "bulk":
                noop.defer(i=-1)
            started = time.perf_counter()
            for start in range(0, count, 10_000):
                noop.batch_defer(*({"i": i} for i in range(start, min(count, start + 10_000))))
            emit(rate=count / (time.perf_counter() - started))
        elif action == "latency":
            gap = float(os.environ.get("BENCH_LATENCY_GAP", "0.02"))
            noop.defer(i=-1)
            sent = {}
            for i in range(count):
                before = time.time()
                latency.defer(i=i)
                sent[i] = (before, time.time())
                time.sleep(gap * (0.5 + random.random()))
            emit(sent=sent)
        else:
            raise SystemExit(f"unknown action {action!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
