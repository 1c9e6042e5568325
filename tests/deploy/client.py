"""Producer programs of the deployment tests, run as ``python -m tests.deploy.client WHAT OUT``.

With ``DJANGO_SETTINGS_MODULE=tests.deploy.settings`` their Django connection
goes through PgBouncer. Each writes one JSON report to OUT; the test reads
it and checks the database itself.

- ``produce``: ``SONIQ_TEST_SINGLE`` single ``enqueue()`` calls, then
  ``SONIQ_TEST_BULK`` ``bulk_enqueue()`` calls of ``SONIQ_TEST_BULK_SIZE``
  jobs, each in its own transaction, as a web process would; the report has
  the ids returned and each failure's class and code.
- ``bystander``: one connection prepares statements while another client
  (``SONIQ_TEST_BYSTANDER_URL``, a pool of one server connection) keeps an
  SQL-level prepared statement there; the admin console
  (``SONIQ_TEST_ADMIN_URL``) swaps the server connection underneath. The
  report says which enqueues were written and whether the bystander's
  statement survived.
- ``wait``: ``SONIQ_TEST_WAITS`` times, enqueue a ``tests.worker.sleep`` job
  (of varied length) and ``wait_for_job`` it; the report has each job's id,
  status and the wall-clock time the wait returned. The wait's re-read is
  put off (``RECHECK_SECONDS``), so only a NOTIFY -- or the fallback's
  polling -- ends a wait early.
"""

import json
import os
import sys
import time
from collections import Counter


def _failure(error: Exception) -> str:
    return f"{type(error).__name__}:{getattr(error, 'code', '')}"


def produce() -> dict:
    from soniq_django import bulk_enqueue, enqueue
    from soniq_django.producer.request import JobRequest

    tag = os.getpid()
    ids, failures = [], Counter()
    for n in range(int(os.environ["SONIQ_TEST_SINGLE"])):
        try:
            ids.append(str(enqueue("tests.worker.ok", {"n": n, "by": tag})))
        except Exception as error:  # every failure is counted by kind, none stops the run
            failures[_failure(error)] += 1
    size = int(os.environ["SONIQ_TEST_BULK_SIZE"])
    for batch in range(int(os.environ["SONIQ_TEST_BULK"])):
        requests = [JobRequest("tests.worker.ok", {"n": batch * size + n, "by": tag, "bulk": 1})
                    for n in range(size)]
        try:
            ids += [str(job_id) for job_id in bulk_enqueue(requests)]
        except Exception as error:
            failures[_failure(error)] += 1
    return {"ids": ids, "failures": dict(failures)}


def bystander() -> dict:
    import psycopg
    from django.db import transaction

    from soniq_django import bulk_enqueue, enqueue
    from soniq_django.producer.request import JobRequest

    def attempt(call) -> str | None:
        try:
            return str(call())
        except Exception as error:
            return _failure(error)

    report = {"first": attempt(lambda: enqueue("tests.worker.ok", {"step": 1}))}
    report["first_bulk"] = attempt(lambda: bulk_enqueue([JobRequest("tests.worker.ok",
                                                                    {"step": 1})])[0])
    # The server connection that holds this client's statements goes away.
    with psycopg.connect(os.environ["SONIQ_TEST_ADMIN_URL"], autocommit=True) as admin:
        admin.execute("RECONNECT")
    time.sleep(0.3)
    with psycopg.connect(os.environ["SONIQ_TEST_BYSTANDER_URL"], autocommit=True) as other:
        other.execute("PREPARE bystander_statement AS SELECT 42")  # on the one server left
        report["after_swap"] = attempt(lambda: enqueue("tests.worker.ok", {"step": 2}))
        report["after_swap_bulk"] = attempt(
            lambda: bulk_enqueue([JobRequest("tests.worker.ok", {"step": 2})])[0])

        def rolled_back():
            with transaction.atomic():
                enqueue("tests.worker.ok", {"step": "rolled back"})
                raise RuntimeError("roll back")

        attempt(rolled_back)
        try:
            report["bystander"] = other.execute("EXECUTE bystander_statement").fetchone()[0]
        except psycopg.Error as error:
            report["bystander"] = error.sqlstate
    return report


def wait() -> dict:
    from soniq_django import enqueue, wait_for_job, waiting

    waiting.RECHECK_SECONDS = 60.0
    waits = []
    for n in range(int(os.environ["SONIQ_TEST_WAITS"])):
        job_id = enqueue("tests.worker.sleep", {"seconds": 0.05 + (n % 5) * 0.07})
        info = wait_for_job(job_id, timeout=30)
        waits.append({"id": str(job_id), "status": info.status, "returned": time.time()})
    return {"waits": waits}


def main(what: str, out: str) -> None:
    import django

    django.setup()
    report = {"produce": produce, "bystander": bystander, "wait": wait}[what]()
    with open(out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
