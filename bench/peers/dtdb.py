"""django-tasks-db's side of the benchmark (bench/.venv-peers).

    python -m bench.peers.dtdb ACTION [COUNT]

with DJANGO_SETTINGS_MODULE=bench.peers.dtdb_settings and BENCH_DB_NAME.
Workers are its own command: ``python -m django db_worker --batch``.
"""

import os
import random
import sys
import time

import django


def main(argv: list[str]) -> None:
    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from bench.common import emit
    from bench.peers.dtdb_app.tasks import latency, noop

    action = argv[0]
    count = int(argv[1]) if len(argv) > 1 else 0

    if action == "migrate":
        call_command("migrate", verbosity=0)
        emit(ok=True)
    elif action == "enqueue":
        noop.enqueue(i=-1)
        started = time.perf_counter()
        for i in range(count):
            noop.enqueue(i=i)
        emit(rate=count / (time.perf_counter() - started))
    elif action == "preload":
        # Not measured: the rows enqueue() would write, in one multi-row INSERT
        # (bulk_create skips pre_save, which fills run_after with its "none" value).
        from django_tasks_db.models import DBTaskResult, get_date_max

        DBTaskResult.objects.bulk_create([
            DBTaskResult(args_kwargs={"args": [], "kwargs": {"i": i}}, priority=noop.priority,
                         task_path=noop.module_path, queue_name=noop.queue_name,
                         run_after=get_date_max(), backend_name="default")
            for i in range(count)
        ], batch_size=2000)
        emit(ok=True)
    elif action == "bulk":
        # The Tasks API has no bulk enqueue: one enqueue() per job in one transaction.
        noop.enqueue(i=-1)
        started = time.perf_counter()
        with transaction.atomic():
            for i in range(count):
                noop.enqueue(i=i)
        emit(rate=count / (time.perf_counter() - started))
    elif action == "latency":
        gap = float(os.environ.get("BENCH_LATENCY_GAP", "0.02"))
        noop.enqueue(i=-1)
        sent = {}
        for i in range(count):
            before = time.time()
            latency.enqueue(i=i)
            sent[i] = (before, time.time())
            time.sleep(gap * (0.5 + random.random()))
        emit(sent=sent)
    else:
        raise SystemExit(f"unknown action {action!r}")
    connection.close()


if __name__ == "__main__":
    main(sys.argv[1:])
