"""soniq_django's side of the benchmark, one action per process (project .venv).

    python -m bench.soniq_tasks ACTION [COUNT]

with DJANGO_SETTINGS_MODULE=bench.soniq_settings and BENCH_DB_NAME set.
Actions: migrate, bulk N, latency N, callcost N (for --profile), wf_plain N,
wf_after_done N, wf_pairs N, wf_batch N (bench/workflows.py), steps N (bench/steps.py). Each prints
one BENCH_RESULT line (bench/common.py). enqueue() one job per transaction is
measured in the orchestrator itself, interleaved with the ceiling.
"""

import os
import random
import sys
import time

import django


def main(argv: list[str]) -> None:
    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from soniq_django import bulk_enqueue, enqueue
    from soniq_django.producer.request import JobRequest

    from bench.common import emit

    action = argv[0]
    count = int(argv[1]) if len(argv) > 1 else 0

    if action == "migrate":
        # --skip-checks: soniq.E006 ("migrations are not all applied") would
        # otherwise stop the very command that applies them.
        call_command("migrate", verbosity=0, skip_checks=True)
        emit(ok=True)
    elif action == "bulk":
        enqueue("bench.noop", {"i": -1})
        started = time.perf_counter()
        ids = bulk_enqueue(JobRequest("bench.noop", {"i": i}) for i in range(count))
        elapsed = time.perf_counter() - started
        assert len(ids) == count
        emit(rate=count / elapsed)
    elif action == "latency":
        # An idle, LISTENing worker is running; space the jobs out so that each
        # one finds it idle. The enqueue time is taken when enqueue() returns,
        # i.e. once the commit (and so the NOTIFY) is acknowledged.
        gap = float(os.environ.get("BENCH_LATENCY_GAP", "0.02"))
        enqueue("bench.noop", {"i": -1})
        sent = {}
        for i in range(count):
            before = time.time()
            enqueue("bench.latency", {"i": i})
            sent[i] = (before, time.time())
            time.sleep(gap * (0.5 + random.random()))
        emit(sent=sent)
    elif action.startswith("wf_"):
        emit(**_workflow_enqueue(action[3:], count))
    elif action == "steps":
        from bench.steps import step_costs

        emit(**step_costs(count))
    elif action == "callcost":
        emit(**_call_costs(count))
    else:
        raise SystemExit(f"unknown action {action!r}")
    connection.close()


def _workflow_enqueue(kind: str, count: int) -> dict:
    """Enqueue ``count`` no-op jobs, 100 per transaction, as bench/workflows.py's ``kind``
    says; return the enqueue rate (jobs per second of the calls), the jobs the drain runs
    and how many rows are done already."""
    import uuid

    from django.db import transaction

    from soniq_django import batch, bulk_enqueue, enqueue
    from soniq_django.producer.request import JobRequest

    enqueue("bench.noop", {"i": -1})  # connect, warm up (a plain job: the drain runs it)
    extra, done_before = 1, 0
    depends_on = None
    if kind == "after_done":
        from django.db import connection

        done = enqueue("bench.noop", {"i": -2})
        with connection.cursor() as cursor:  # as if a worker had run it
            cursor.execute("UPDATE soniq_jobs SET status = 'done' WHERE id = %s", [done])
        depends_on, done_before = [done], 1
    written = 0
    started = time.perf_counter()
    for start in range(0, count, 100):
        if kind in ("plain", "after_done"):
            written += len(bulk_enqueue([JobRequest("bench.noop", {"i": i}, depends_on=depends_on)
                                         for i in range(start, start + 100)]))
        elif kind == "pairs":
            requests = []
            for i in range(start, start + 100, 2):
                first = uuid.uuid4()
                requests += [JobRequest("bench.noop", {"i": i}, job_id=first),
                             JobRequest("bench.noop", {"i": i + 1}, depends_on=[first])]
            written += len(bulk_enqueue(requests))
        elif kind == "batch":
            with transaction.atomic():
                info = batch([JobRequest("bench.noop", {"i": i})
                              for i in range(start, start + 100)],
                             on_complete=JobRequest("bench.noop", {"i": -3}))
            written += len(info.job_ids) + 1
        else:
            raise SystemExit(f"unknown workflow kind {kind!r}")
    elapsed = time.perf_counter() - started
    return {"rate": count / elapsed, "jobs": written + extra, "done_before": done_before}


def _call_costs(count: int) -> dict:
    """Mean ms per call of what a job costs through Django (for --profile)."""
    import secrets
    import uuid

    from django.db import close_old_connections, connection

    from soniq_django import bulk_enqueue, enqueue
    from soniq_django.producer.request import JobRequest
    from soniq_django.owned import OwnedJobSource

    def mean_ms(body) -> float:
        started = time.perf_counter()
        for i in range(count):
            body(i)
        return (time.perf_counter() - started) / count * 1000

    found = {}
    found["enqueue() (autocommit)"] = mean_ms(lambda i: enqueue("bench.noop", {"i": i}))

    def reopen(i):
        connection.close()
        connection.ensure_connection()

    found["Django: close + open the connection"] = mean_ms(reopen)
    bulk_enqueue(JobRequest("bench.noop", {"i": i}) for i in range(count * 2))
    source = OwnedJobSource()
    owner = str(uuid.uuid4())
    claimed = []
    found["OwnedJobSource.claim_next_owned()"] = mean_ms(lambda i: claimed.append(
        source.claim_next_owned(owner, claim_token=secrets.token_hex(16))))
    found["OwnedJobSource.set_pid_owned()"] = mean_ms(
        lambda i: source.set_pid_owned(claimed[i].claim_fence, 4242))
    found["OwnedJobSource.complete_owned()"] = mean_ms(
        lambda i: source.complete_owned(claimed[i].claim_fence, None))
    claimed.clear()
    for _ in range(count):
        claimed.append(source.claim_next_owned(owner, claim_token=secrets.token_hex(16)))

    def after_close(i):
        close_old_connections()  # what the worker's job thread does after every job
        source.complete_owned(claimed[i].claim_fence, None)

    found["close_old_connections() + complete_owned()"] = mean_ms(after_close)
    return found


if __name__ == "__main__":
    main(sys.argv[1:])
