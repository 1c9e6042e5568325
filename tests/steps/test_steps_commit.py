"""An atomic step whose COMMIT's answer was lost: settled from the database, never run again."""

import logging
import threading

import pytest
from django.db import OperationalError, connection, connections

from soniq_django import enqueue, get_job
from soniq_django.models import Job
from soniq_django.steps import recorded_steps
from soniq_django.worker import Worker
from tests.support.workers import WorkerThread, wait_until
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True)]


def lose_the_answer_of_the_first_step_commit(monkeypatch, worker: Worker, *, land: bool,
                                             seen: list) -> None:
    """The first COMMIT of a job thread's own connection (the handler is not atomic: only its
    atomic steps commit there) is made, or not, and then errs as a lost connection does."""
    wrapper = type(connections["default"])
    real = wrapper.commit

    def commit(self):
        if (not seen and threading.current_thread().name.startswith("soniq-job")
                and self is not worker.shared._wrapper):
            seen.append(self.alias)
            if land:
                real(self)
            raise OperationalError("server closed the connection unexpectedly")
        return real(self)

    monkeypatch.setattr(wrapper, "commit", commit)


def effects(job_id) -> list[tuple[str, int]]:
    return sorted(Effect.objects.filter(job_id=job_id).values_list("note", "attempt"))


def test_a_step_commit_that_landed_unacknowledged_is_kept_and_the_run_goes_on(monkeypatch,
                                                                              caplog):
    caplog.set_level(logging.WARNING, logger="soniq_django.steps")
    job_id = enqueue("tests.steps.three", {"atomic": True})
    worker, seen = Worker(burst=True), []
    lose_the_answer_of_the_first_step_commit(monkeypatch, worker, land=True, seen=seen)
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
    lose_the_answer_of_the_first_step_commit(monkeypatch, worker, land=False, seen=seen)
    assert WorkerThread(worker).start().join() == 0
    info = get_job(job_id)
    assert (info.status, info.attempts) == ("done", 2)
    assert effects(job_id) == [("a", 2), ("b", 2), ("c", 2)]  # attempt 1 kept nothing
    assert "the database shows it did not happen" in Job.objects.get(id=job_id).last_error


#: A deferred trigger makes the first attempt's COMMIT of step "b" take 2 s (and names its
#: backend), so that the test can terminate that backend while the COMMIT runs.
SLOW_COMMIT_MARK = "soniq-test-slow-step-commit"
SLOW_COMMIT = f"""
CREATE FUNCTION test_slow_step_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM set_config('application_name', '{SLOW_COMMIT_MARK}', true);
  PERFORM pg_sleep(2);
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER test_slow_step_commit AFTER INSERT ON testapp_effect
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
  WHEN (NEW.note = 'b' AND NEW.attempt = 1) EXECUTE FUNCTION test_slow_step_commit();
"""


def _backend_in_commit() -> int | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                       "AND application_name = %s AND state = 'active' AND query = 'COMMIT'",
                       [SLOW_COMMIT_MARK])
        row = cursor.fetchone()
    return row[0] if row else None


@pytest.mark.postgresql_only
def test_a_step_whose_connection_is_terminated_at_commit_keeps_nothing_and_runs_once_more():
    with connection.cursor() as cursor:
        cursor.execute(SLOW_COMMIT)
    try:
        job_id = enqueue("tests.steps.three", {"atomic": True})
        with WorkerThread(Worker(burst=True)) as running:
            committing = wait_until(_backend_in_commit, 20, "step b's COMMIT")
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [committing])
                assert cursor.fetchone() == (True,)
            assert running.join() == 0
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS test_slow_step_commit ON testapp_effect; "
                           "DROP FUNCTION IF EXISTS test_slow_step_commit()")
    info = get_job(job_id)
    assert (info.status, info.attempts) == ("done", 2)
    # Step a committed on attempt 1 and was not run again; b's first COMMIT never happened.
    assert effects(job_id) == [("a", 1), ("b", 2), ("c", 2)]
    assert [(r.name, r.attempt) for r in recorded_steps(job_id)] == [
        ("a", 1), ("b", 2), ("c", 2)]
