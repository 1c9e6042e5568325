"""Atomic jobs through an outage: what the effects chaos run (tests/chaos/) found.

A PostgreSQL fast shutdown closes a job's connection under its open
transaction; the fenced completion fails, and Django's rollback, finding the
connection dead, closes it and reconnects to restore autocommit -- which the
server, shutting down, refuses. That refusal used to replace the run's own
outcome and reach the worker as "worker error in the atomic run", with a
traceback. Here the same happens on a real server, deterministically: the
job's backend is terminated while its handler waits inside the transaction,
and the database stops admitting connections (``ALLOW_CONNECTIONS false``)
until the run's failure is written on the worker's own, already open,
connection.
"""

import logging

import psycopg
import pytest
from django.db import connection

from soniq_django import enqueue
from soniq_django.models import Job
from soniq_django.worker import Worker
from tests.support.workers import WorkerThread, wait_until
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql_only,
              pytest.mark.usefixtures("fast")]


def _backend_idle_in_transaction() -> int | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid() AND state = 'idle in transaction'")
        found = cursor.fetchall()
    return found[0][0] if len(found) == 1 else None


def _admit_connections(allowed: bool) -> None:
    """Let the test database admit new connections, or not (from the maintenance database:
    a session cannot disallow its own database)."""
    settings = connection.settings_dict
    with psycopg.connect(host=settings["HOST"] or None, port=settings["PORT"] or None,
                         user=settings["USER"] or None, password=settings["PASSWORD"] or None,
                         dbname="postgres", autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{settings["NAME"]}" '
                      f'ALLOW_CONNECTIONS {str(allowed).lower()}')


def test_a_rollback_that_cannot_reconnect_ends_the_run_as_its_own_failure(
        tmp_path, run_log, caplog):
    caplog.set_level(logging.INFO, logger="soniq_django.worker")
    gate = tmp_path / "gate"
    job_id = enqueue("tests.atomic.effect", {"note": "cut", "gate": str(gate)})
    try:
        with WorkerThread(Worker(burst=True)) as running:
            run_log.wait_for("start", job_id)
            backend = wait_until(_backend_idle_in_transaction, 20, "the run's open transaction")
            _admit_connections(False)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [backend])
            gate.touch()  # the handler returns; its completion meets the dead connection
            wait_until(lambda: Job.objects.filter(id=job_id, last_error__isnull=False).exists(),
                       20, "the run's failure, written on the worker's open connection")
            _admit_connections(True)
            assert running.join() == 0
    finally:
        _admit_connections(True)
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts) == ("done", 2)
    assert list(Effect.objects.filter(job_id=job_id).values_list("generation", "note")) == [
        (2, "cut")]
    assert [e.attempt for e in run_log.events("start", job_id)] == [1, 2]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert errors == [], [r.getMessage() for r in errors]
    assert any("connection was lost while its atomic run rolled back" in r.getMessage()
               for r in caplog.records)
