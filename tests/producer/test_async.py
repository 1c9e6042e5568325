"""The async twins (aenqueue, abulk_enqueue, aget_job, handler.aenqueue) and the async-context error.

Each scenario runs in an event loop through ``async_to_sync``, as Django runs
an async view: the loop has a thread of its own, and the twins' database
work comes back to the test's thread -- and so into its transaction.
"""

import uuid

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction

from soniq_django import abulk_enqueue, aenqueue, aget_job, bulk_enqueue, enqueue, get_job, job
from soniq_django.errors import ConfigValidationError, ErrorCode, SoniqError
from soniq_django.models import Job
from soniq_django.producer.api import refuse_event_loop
from soniq_django.producer.request import JobRequest

pytestmark = pytest.mark.django_db


@job(name="tests.producer.async_send")
def send(order_id: int, note: str = "") -> None:
    pass


def in_loop(coroutine_function):
    return async_to_sync(coroutine_function)()


def test_aenqueue_inserts_and_aget_job_reads_back():
    async def scenario():
        job_id = await aenqueue("billing.send_invoice", {"order_id": 1}, queue="billing",
                                priority=5)
        return job_id, await aget_job(job_id), await aget_job(str(uuid.uuid4()))

    job_id, info, missing = in_loop(scenario)
    row = Job.objects.get(id=job_id)
    assert (row.job_name, row.args, row.queue, row.priority) == (
        "billing.send_invoice", {"order_id": 1}, "billing", 5)
    assert (info.id, info.status) == (job_id, "queued") and missing is None


def test_abulk_enqueue_keeps_request_order():
    requests = [JobRequest("reports.daily", {"n": n}) for n in range(3)]

    async def scenario():
        return await abulk_enqueue(requests), await abulk_enqueue([])

    ids, none = in_loop(scenario)
    assert [Job.objects.get(id=i).args["n"] for i in ids] == [0, 1, 2] and none == []


def test_handler_aenqueue_and_configured_aenqueue():
    async def scenario():
        first = await send.aenqueue(order_id=1)
        second = await send.configure(queue="mail", priority=3).aenqueue(2, note="x")
        return first, second

    first, second = in_loop(scenario)
    assert Job.objects.get(id=first).args == {"order_id": 1}
    row = Job.objects.get(id=second)
    assert (row.job_name, row.queue, row.priority, row.args) == (
        "tests.producer.async_send", "mail", 3, {"order_id": 2, "note": "x"})


def test_input_is_checked_at_the_call_before_any_await():
    with pytest.raises(ConfigValidationError) as bad_name:
        aenqueue("Not A Job Name")
    assert bad_name.value.code is ErrorCode.INVALID_TASK_NAME
    with pytest.raises(ConfigValidationError) as bad_args:
        send.aenqueue(order_id=1, unknown=2)
    assert bad_args.value.code is ErrorCode.TASK_ARGS_INVALID
    with pytest.raises(ConfigValidationError):
        abulk_enqueue([JobRequest("ok.name"), JobRequest("Bad Name")])
    with pytest.raises(ConfigValidationError):
        aget_job("not-a-uuid")
    assert not Job.objects.exists()


def test_args_are_copied_at_the_call():
    args = {"order_id": 1}

    async def scenario():
        pending = aenqueue("billing.send_invoice", args)
        args["order_id"] = 2  # after the call, before the await
        return await pending

    assert Job.objects.get(id=in_loop(scenario)).args == {"order_id": 1}


def test_the_rows_join_the_callers_transaction():
    async def scenario():
        return await aenqueue("billing.send_invoice")

    with pytest.raises(RuntimeError), transaction.atomic():
        job_id = in_loop(scenario)
        assert Job.objects.filter(id=job_id).exists()
        raise RuntimeError("roll back")
    assert not Job.objects.filter(id=job_id).exists()


@pytest.mark.parametrize(("call", "twin"), [
    (lambda: enqueue("billing.send_invoice"), "aenqueue"),
    (lambda: bulk_enqueue([JobRequest("billing.send_invoice")]), "abulk_enqueue"),
    (lambda: get_job(uuid.uuid4()), "aget_job"),
    (lambda: send.enqueue(order_id=1), "aenqueue"),
    (lambda: send.configure(priority=1).enqueue(order_id=1), "aenqueue"),
    (lambda: send.enqueue_on_commit(order_id=1), "aenqueue"),
], ids=["enqueue", "bulk_enqueue", "get_job", "handler", "configured", "on_commit"])
def test_sync_calls_in_an_event_loop_name_their_twin(call, twin):
    async def scenario():
        with pytest.raises(SoniqError) as raised:
            call()
        return raised.value

    error = in_loop(scenario)
    assert error.code is ErrorCode.ASYNC_CONTEXT
    assert f"await {twin}(" in error.reason
    assert not Job.objects.exists()


def test_django_allow_async_unsafe_lifts_the_check(monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

    async def scenario():
        refuse_event_loop("enqueue", "aenqueue")  # Django's own escape hatch: no error
        monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE")
        with pytest.raises(SoniqError):
            refuse_event_loop("enqueue", "aenqueue")

    in_loop(scenario)
