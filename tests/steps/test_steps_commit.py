"""An atomic step whose COMMIT's answer was lost: settled from the database, never run again."""

import logging

import pytest
from django.db import connection

from soniq_django import enqueue, get_job
from soniq_django.models import Job
from soniq_django.steps import recorded_steps
from soniq_django.worker import Worker
from tests.support.commits import (backend_in_commit, lose_the_first_job_thread_commit,
                                   release_cut_sockets, slow_commit)
from tests.support.workers import FAST, WorkerThread, wait_until
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True)]


def effects(job_id) -> list[tuple[str, int]]:
    return sorted(Effect.objects.filter(job_id=job_id).values_list("note", "attempt"))


def test_a_step_commit_that_landed_unacknowledged_is_kept_and_the_run_goes_on(monkeypatch,
                                                                              caplog):
    caplog.set_level(logging.WARNING, logger="soniq_django.steps")
    job_id = enqueue("tests.steps.three", {"atomic": True})
    worker, seen = Worker(burst=True), []
    lose_the_first_job_thread_commit(monkeypatch, worker, land=True, seen=seen)
    assert WorkerThread(worker).start().join() == 0
    assert seen == ["default"]
    info = get_job(job_id)
    assert (info.status, info.attempts) == ("done", 1)  # the run went on after step a
    assert effects(job_id) == [("a", 1), ("b", 1), ("c", 1)]
    assert any("was not acknowledged; recovering" in r.getMessage() for r in caplog.records)


def test_a_step_commit_that_failed_unseen_stops_the_run_and_the_next_runs_the_step_once(
        monkeypatch):
    job_id = enqueue("tests.steps.three", {"atomic": True})
    worker, seen = Worker(burst=True), []
    lose_the_first_job_thread_commit(monkeypatch, worker, land=False, seen=seen)
    assert WorkerThread(worker).start().join() == 0
    info = get_job(job_id)
    assert (info.status, info.attempts) == ("done", 2)
    assert effects(job_id) == [("a", 2), ("b", 2), ("c", 2)]  # attempt 1 kept nothing
    assert "the database shows it did not happen" in Job.objects.get(id=job_id).last_error


#: The first attempt's COMMIT of step "b" takes 2 s and names its backend this
#: (tests/support/commits.py), so that the test can terminate that backend while it runs.
SLOW_COMMIT_MARK = "soniq-test-slow-step-commit"


@pytest.mark.postgresql_only
def test_a_step_whose_connection_is_terminated_at_commit_keeps_nothing_and_runs_once_more():
    with slow_commit(SLOW_COMMIT_MARK, "NEW.note = 'b' AND NEW.attempt = 1"):
        job_id = enqueue("tests.steps.three", {"atomic": True})
        with WorkerThread(Worker(burst=True)) as running:
            committing = wait_until(lambda: backend_in_commit(SLOW_COMMIT_MARK), 20,
                                    "step b's COMMIT")
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [committing])
                assert cursor.fetchone() == (True,)
            assert running.join() == 0
    info = get_job(job_id)
    assert (info.status, info.attempts) == ("done", 2)
    # Step a committed on attempt 1 and was not run again; b's first COMMIT never happened.
    assert effects(job_id) == [("a", 1), ("b", 2), ("c", 2)]
    assert [(r.name, r.attempt) for r in recorded_steps(job_id)] == [
        ("a", 1), ("b", 2), ("c", 2)]


@pytest.mark.postgresql_only  # a lost COMMIT needs a server on the other end of a connection
def test_a_step_commit_lost_in_a_partition_is_settled_once_the_server_ends_it(settings):
    """The step's COMMIT never reaches the server, whose backend keeps the transaction open,
    holding the job's row. The record set idle_in_transaction_session_timeout (a third of the
    lease): the server ends the transaction, the settle's fenced heartbeat then gets the row,
    finds no record, and the next attempt runs the step once."""
    settings.SONIQ = {**FAST, "LEASE_SECONDS": 2, "HEARTBEAT_SECONDS": 0.5}
    job_id = enqueue("tests.steps.lost_commit")
    try:
        with WorkerThread(Worker(burst=True)) as running:
            assert running.join(30) == 0
    finally:
        release_cut_sockets()
    info = get_job(job_id)
    assert (info.status, info.attempts) == ("done", 2)
    assert effects(job_id) == [("a", 2)]
    # Settled from the database (without the server's bound the row stays held: the
    # settle's three leases run out, and so does the run's claim).
    assert "the database shows it did not happen" in Job.objects.get(id=job_id).last_error
