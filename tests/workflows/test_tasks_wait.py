"""The Tasks backend waits as wait_for_job does, and refresh() reads the same afterwards."""

import asyncio
import threading
import time

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from soniq_django.errors import ErrorCode, SoniqError
from soniq_django.owned import OwnedJobSource
from soniq_django.tasks_backend import TaskResultStatus
from tests.support.owned import claim
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def close_the_async_threads_connections():
    """``await_result`` and Django's ``arefresh`` read through asgiref's thread; close the
    connection that thread opened, as a request's end would, so no later test meets it."""
    yield
    asyncio.run(sync_to_async(connections.close_all)())


def later(seconds, call) -> None:
    def run():
        time.sleep(seconds)
        try:
            call()
        finally:
            connections.close_all()

    threading.Thread(target=run, daemon=True).start()


def test_wait_for_result_then_refresh_agree_on_a_done_task():
    result = tasks.add.enqueue(1, 2)
    source = OwnedJobSource()
    fence = claim(source).claim_fence
    later(0.2, lambda: source.complete_owned(fence, {"sum": 3}))
    backend = tasks.add.get_backend()
    waited = backend.wait_for_result(result.id, timeout=20)
    assert waited.status == TaskResultStatus.SUCCESSFUL and waited.return_value == {"sum": 3}
    result.refresh()
    assert (result.status, result.return_value, result.finished_at) == (
        waited.status, waited.return_value, waited.finished_at)


def test_a_cancelled_task_is_failed_both_ways_and_the_async_twin_waits_too():
    result = tasks.add.enqueue(1, 2)
    later(0.2, lambda: OwnedJobSource().request_cancel(result.id))
    backend = tasks.add.get_backend()
    waited = asyncio.run(backend.await_result(result.id, timeout=20))
    assert waited.status == TaskResultStatus.FAILED
    asyncio.run(result.arefresh())
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == [
        e.exception_class_path for e in waited.errors]


def test_a_task_that_does_not_finish_in_time_raises_wait_timeout():
    result = tasks.add.enqueue(1, 2)
    with pytest.raises(SoniqError) as raised:
        tasks.add.get_backend().wait_for_result(result.id, timeout=0.2)
    assert raised.value.code is ErrorCode.WAIT_TIMEOUT
    result.refresh()
    assert result.status == TaskResultStatus.READY
