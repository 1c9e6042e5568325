"""pgqueuer's side of the benchmark (bench/.venv-peers).

    python -m bench.peers.pgqueuer_bench ACTION [COUNT] [BATCH]

with BENCH_DB_NAME set. pgqueuer is asyncio only: producers and the worker
use one asyncpg connection each (its default driver). Schema: ``install()``
with the default durability ("durable": every table LOGGED). The worker is
``QueueManager.run(batch_size=N, mode=drain)`` (``mode=continuous`` for the
latency run) with every other option at its default; ``batch_size`` is how
many jobs one dequeue takes, and so bounds the jobs in flight per round.
"""

import asyncio
import json
import os
import random
import signal
import sys
import time

import asyncpg
from pgqueuer import AsyncpgDriver, Queries, QueueManager
from pgqueuer.types import QueueExecutionMode

from bench.common import conninfo, emit, stamp


async def _connect() -> asyncpg.Connection:
    params = conninfo(os.environ["BENCH_DB_NAME"])
    return await asyncpg.connect(
        host=params.get("host"), port=int(params.get("port") or 5432),
        user=params.get("user"), password=params.get("password") or None,
        database=params["dbname"],
    )


def _payload(i: int) -> bytes:
    return json.dumps({"i": i}).encode()


async def worker(batch: int, mode: str) -> None:
    connection = await _connect()
    qm = QueueManager(Queries(AsyncpgDriver(connection)))

    @qm.entrypoint("noop")
    async def noop(job) -> None:
        stamp()

    @qm.entrypoint("latency")
    async def latency(job) -> None:
        stamp(json.loads(job.payload)["i"])

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, qm.shutdown.set)
    await qm.run(batch_size=batch, mode=QueueExecutionMode(mode))
    await connection.close()


async def produce(action: str, count: int) -> None:
    connection = await _connect()
    queries = Queries(AsyncpgDriver(connection))
    if action == "migrate":
        await queries.install()
        emit(ok=True)
    elif action == "enqueue":
        await queries.enqueue("noop", _payload(-1))
        started = time.perf_counter()
        for i in range(count):
            await queries.enqueue("noop", _payload(i))
        emit(rate=count / (time.perf_counter() - started))
    elif action in ("bulk", "preload"):
        if action == "bulk":
            await queries.enqueue("noop", _payload(-1))
        started = time.perf_counter()
        for start in range(0, count, 10_000):
            numbers = range(start, min(count, start + 10_000))
            await queries.enqueue(["noop"] * len(numbers), [_payload(i) for i in numbers],
                                  [0] * len(numbers))
        emit(rate=count / (time.perf_counter() - started))
    elif action == "aggregate":
        # What its worker runs every 30 s by default (log_aggregation_interval): fold the
        # new pgqueuer_log rows into pgqueuer_statistics (bench/wal.py counts its WAL).
        await queries.aggregate_logs()
        emit(ok=True)
    elif action == "latency":
        gap = float(os.environ.get("BENCH_LATENCY_GAP", "0.02"))
        await queries.enqueue("noop", _payload(-1))
        sent = {}
        for i in range(count):
            before = time.time()
            await queries.enqueue("latency", _payload(i))
            sent[i] = (before, time.time())
            await asyncio.sleep(gap * (0.5 + random.random()))
        emit(sent=sent)
    else:
        raise SystemExit(f"unknown action {action!r}")
    await connection.close()


def main(argv: list[str]) -> None:
    action = argv[0]
    count = int(argv[1]) if len(argv) > 1 else 0
    if action == "worker":
        asyncio.run(worker(int(argv[2]), argv[3] if len(argv) > 3 else "drain"))
        emit(ok=True)
    else:
        asyncio.run(produce(action, count))


if __name__ == "__main__":
    main(sys.argv[1:])
