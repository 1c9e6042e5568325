"""Prepare the chaos database: migrate, add the chaos tables, enqueue the jobs.

Run by the driver as ``python -m tests.chaos.prepare SPEC.json [JOB_NAME]`` with
``DJANGO_SETTINGS_MODULE=tests.chaos.settings`` and the cluster's URL in
``SONIQ_WORKER_DATABASE_URL``. SPEC.json is a list of the job's args; the
job is ``chaos.work`` unless JOB_NAME says otherwise (``chaos.effect``).
A SPEC.json that is an object ``{"workflow": [...]}`` is the workflows
scenario's plan, enqueued by tests/chaos/workflows.py's ``prepare``.
The jobs go in with ``bulk_enqueue`` (the public Python API), in the same
transaction as their ids' copy in ``chaos_enqueued``: what the checker
counts is exactly what was committed.
"""

import json
import sys


def main(spec_path: str, job_name: str = "chaos.work") -> None:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from soniq_django import bulk_enqueue
    from soniq_django.producer.request import JobRequest
    from tests.chaos.schema import SCHEMA_SQL

    call_command("migrate", interactive=False, verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(SCHEMA_SQL)
    with open(spec_path) as f:
        specs = json.load(f)
    if isinstance(specs, dict):
        from tests.chaos.workflows import prepare

        print(f"enqueued {prepare(specs['workflow'])}")
        return
    for start in range(0, len(specs), 2000):
        chunk = specs[start:start + 2000]
        with transaction.atomic():
            # A keyed job (the keys scenario) gets its key as its handler computes it.
            ids = bulk_enqueue([JobRequest(job_name, args, max_attempts=50,
                                           concurrency_key=args.get("key"),
                                           key_concurrency=1 if "key" in args else None)
                                for args in chunk])
            with connection.cursor() as cursor:
                cursor.executemany("INSERT INTO chaos_enqueued (job_id) VALUES (%s)",
                                   [(job_id,) for job_id in ids])
    print(f"enqueued {len(specs)}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
