"""current_job().set_progress(): checked, coalesced, fenced, kept with the job, shown."""

import datetime as dt
import threading
import time

import pytest
from django.db import connection
from hypothesis import given, strategies as st

from soniq_django import enqueue, get_job, wait_for_job
from soniq_django.errors import ConfigValidationError, ErrorCode
from soniq_django.models import DeadLetterJob, Job, JobProgress
from soniq_django.owned import OwnedJobSource
from soniq_django.owned.source import OwnedJobSource as Source
from soniq_django.progress import MAX_NOTE, checked
from soniq_django.testing import run_jobs
from soniq_django.worker import Worker
from soniq_django.worker.context import JobContext
from soniq_django.worker.progress import ProgressWriter
from tests.support.owned import claim, rewrite
from tests.support.workers import WorkerThread, soniq, wait_until

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def fast_workers(settings):
    soniq(settings)


@pytest.fixture
def writes(monkeypatch):
    """Every progress write made (the value), counted where the worker makes them."""
    made = []
    real = Source._set_progress

    def counting(self, fence, value, lock_wait=None):
        made.append(value)
        return real(self, fence, value, lock_wait)

    monkeypatch.setattr(Source, "_set_progress", counting)
    return made


def progress(job_id):
    return get_job(job_id).progress


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_handlers_last_value_is_kept_and_writes_are_coalesced(writes, concurrency):
    job_id = enqueue("tests.progress.steps", {"steps": 50, "pause": 0.03, "note": "rows"})
    assert WorkerThread(Worker(burst=True, concurrency=concurrency)).start().join() == 0
    found = progress(job_id)
    assert found["done"] == 50 and found["total"] == 50 and found["note"] == "finished"
    assert isinstance(found["updated_at"], dt.datetime)
    # 51 reports over about 1.5 s: the first at once, one a second, and the last.
    assert 2 <= len(writes) <= 4
    assert writes[-1].done == 50


def test_progress_is_visible_while_the_job_runs(tmp_path, writes):
    gate = tmp_path / "gate"
    job_id = enqueue("tests.progress.steps", {"steps": 10, "gate": str(gate)})
    worker = WorkerThread(Worker(burst=True)).start()
    try:
        # 0 is written at once, the latest value (9 of 10) a second later.
        wait_until(lambda: (progress(job_id) or {}).get("done") == 9, 5, "progress 9 of 10")
        assert get_job(job_id).status == "processing"
        with pytest.raises(Exception) as raised:
            wait_for_job(job_id, timeout=0.1)
        assert raised.value.code is ErrorCode.WAIT_TIMEOUT
        assert raised.value.job.progress["done"] == 9  # a caller that polls sees it too
    finally:
        gate.touch()
    assert worker.join() == 0
    assert progress(job_id)["done"] == 10


@pytest.mark.parametrize("concurrency", [1, 3])
def test_an_async_handler_reports_progress(concurrency):
    job_id = enqueue("tests.progress.async_steps", {"steps": 20})
    assert WorkerThread(Worker(burst=True, concurrency=concurrency)).start().join() == 0
    assert get_job(job_id).status == "done"
    found = progress(job_id)
    assert (found["done"], found["total"], found["note"]) == (20, 20, None)


def test_an_atomic_handler_reports_progress():
    job_id = enqueue("tests.progress.atomic", {"steps": 5})
    assert WorkerThread(Worker(burst=True)).start().join() == 0
    assert get_job(job_id).status == "done"
    assert progress(job_id)["done"] == 5 and progress(job_id)["note"] == "atomic"


def test_run_jobs_writes_the_last_value():
    job_id = enqueue("tests.progress.steps", {"steps": 3})
    run_jobs()
    assert progress(job_id)["done"] == 3


def test_a_lapsed_claim_writes_no_progress():
    source = OwnedJobSource()
    job_id = enqueue("tests.worker.ok")
    stale = claim(source).claim_fence
    rewrite(job_id, lease_expires_at=dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc))
    assert source.set_progress_owned(stale, 1, 2) is False
    # Through a handler's context, as the worker writes it: nothing either.
    writer = ProgressWriter(source, source)
    context = JobContext(job_id=str(job_id), job_name="tests.worker.ok", queue="default",
                         attempts=1, max_attempts=4, generation=stale.generation,
                         _fence=stale, _progress=writer)
    context.set_progress(5, 10, "stale")
    writer.flush(context)
    writer.close()
    assert not JobProgress.objects.exists()
    # Claimed again: the new claim writes, the old one still cannot.
    fresh = claim(source).claim_fence
    assert source.set_progress_owned(fresh, 3, None, "fresh") is True
    assert source.set_progress_owned(stale, 9, 9) is False
    assert progress(job_id)["done"] == 3 and progress(job_id)["note"] == "fresh"
    source.complete_owned(fresh)
    assert source.set_progress_owned(fresh, 4) is False  # finished: nothing more


def test_progress_stays_after_the_job_finished_and_goes_when_it_is_purged():
    source = OwnedJobSource()
    done_id, dead_id = enqueue("tests.worker.ok"), enqueue("tests.worker.ok")
    for job_id in (done_id, dead_id):
        fence = claim(source).claim_fence
        assert source.set_progress_owned(fence, 1, 2)
        if fence.job_id == str(done_id):
            source.complete_owned(fence)
        else:
            source.fail_owned(fence, "no", retry=False)
    assert progress(done_id)["done"] == 1 and progress(dead_id)["done"] == 1
    assert get_job(dead_id).status == "dead_letter"
    Job.objects.filter(id=done_id).delete()
    DeadLetterJob.objects.filter(id=dead_id).delete()
    assert not JobProgress.objects.exists()


@given(done=st.integers(min_value=0, max_value=2**63 - 1),
       total=st.none() | st.integers(min_value=0, max_value=2**63 - 1),
       note=st.none() | st.text(max_size=MAX_NOTE).filter(lambda t: "\x00" not in t))
def test_valid_progress_is_taken_as_it_is(done, total, note):
    value = checked(done, total, note)
    assert (value.done, value.total, value.note) == (done, total, note)


@pytest.mark.parametrize("args", [
    (-1,), (True,), (1.0,), ("1",), (None,), (2**63,), (1, -1), (1, False), (1, 2.5),
    (1, None, 5), (1, None, "x" * (MAX_NOTE + 1)), (1, None, "a\x00b"), (1, None, "\ud800"),
])
def test_bad_progress_is_refused_in_the_handlers_call(args):
    with pytest.raises(ConfigValidationError) as raised:
        checked(*args)
    assert raised.value.code is ErrorCode.CONFIG
    context = JobContext(job_id="x", job_name="n", queue="q", attempts=1, max_attempts=1)
    with pytest.raises(ConfigValidationError):
        context.set_progress(*args)


@pytest.mark.postgresql_only  # the SQL API is PostgreSQL's
def test_the_sql_function_checks_its_input_too():
    from django.db import DataError

    with pytest.raises(DataError) as raised, connection.cursor() as cursor:
        cursor.execute("SELECT soniq_set_progress('x', 'w', 1, 't', 'q', -1)")
    diag = raised.value.__cause__.diag
    assert (diag.sqlstate, diag.message_hint) == ("22023", "CONFIG")


def test_the_admin_page_shows_progress(admin_client):
    source = OwnedJobSource()
    job_id = enqueue("tests.worker.ok")
    fence = claim(source).claim_fence
    source.set_progress_owned(fence, 40, 200, "rows exported")
    page = admin_client.get(f"/admin/soniq_django/job/{job_id}/change/")
    assert page.status_code == 200
    assert "40 of 200 (20%) - rows exported" in page.content.decode()
    source.fail_owned(fence, "no", retry=False)
    page = admin_client.get(f"/admin/soniq_django/deadletterjob/{job_id}/change/")
    assert "40 of 200 (20%) - rows exported" in page.content.decode()
