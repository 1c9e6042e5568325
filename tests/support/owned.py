"""Shared helpers for the owned-queue tests."""

import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection, connections, transaction

from soniq_django.models import Job
from soniq_django.owned import ClaimedJob


def nonce() -> str:
    return secrets.token_hex(16)


def claim(source, worker="worker-1", queues=None) -> ClaimedJob:
    """``source.claim_next_owned(worker)`` with a fresh nonce: a job must be there to claim."""
    claimed = source.claim_next_owned(worker, claim_token=nonce(), queues=queues)
    assert claimed is not None
    return claimed


@contextmanager
def row_locked(job_id) -> Iterator[None]:
    """Inside, another connection's transaction holds the job's row (``SELECT ... FOR UPDATE``).

    An operator's open transaction, as in psql. On SQLite the select takes no lock.
    """
    locked, unlock = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                list(Job.objects.select_for_update().filter(id=job_id))
                locked.set()
                unlock.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10), "the row lock was not taken"
        yield
    finally:
        unlock.set()
        holder.join(10)


def rewrite(job_id, **values) -> None:
    """Change a job row behind the API's back (test set-up only).

    On PostgreSQL the protection trigger skips writes to owned rows unless
    the gate is open, exactly as it does for an old worker's UPDATE.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('soniq.fenced_write', 'on', false)")
    try:
        assert Job.objects.filter(id=job_id).update(**values) == 1
    finally:
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('soniq.fenced_write', 'off', false)")


def refuse_updates(pg_condition: str, sqlite_condition: str) -> None:
    """Install a trigger that fails every UPDATE of soniq_jobs matching the condition.

    A hostile schema, for the tests of what a refusal does. The conditions
    are SQL over OLD/NEW in each database's dialect. ``drop_refusal`` removes it.
    """
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'refused by a test trigger'; END $$")
            cursor.execute("CREATE TRIGGER test_refuse BEFORE UPDATE ON soniq_jobs FOR EACH ROW "
                           f"WHEN ({pg_condition}) EXECUTE FUNCTION test_refuse()")
        else:
            cursor.execute(f"CREATE TRIGGER test_refuse BEFORE UPDATE ON soniq_jobs "
                           f"WHEN {sqlite_condition} "
                           "BEGIN SELECT RAISE(ABORT, 'refused by a test trigger'); END")


def drop_refusal() -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("DROP TRIGGER IF EXISTS test_refuse ON soniq_jobs")
            cursor.execute("DROP FUNCTION IF EXISTS test_refuse()")
        else:
            cursor.execute("DROP TRIGGER IF EXISTS test_refuse")
