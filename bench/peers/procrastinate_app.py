"""The procrastinate app and its tasks (a module of its own, as procrastinate asks)."""

import os

import procrastinate

from bench.common import dsn, stamp

# The worker's pool size comes from BENCH_POOL_SIZE (the orchestrator sets max(4, N + 2)).
_POOL = int(os.environ.get("BENCH_POOL_SIZE", "4"))
app = procrastinate.App(connector=procrastinate.PsycopgConnector(
    conninfo=dsn(os.environ["BENCH_DB_NAME"]), min_size=_POOL, max_size=_POOL))


@app.task(name="noop")
async def noop(i: int = 0) -> None:
    stamp()


@app.task(name="latency")
async def latency(i: int) -> None:
    stamp(i)
