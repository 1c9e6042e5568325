"""The example project's views: on-commit and async enqueues; its jobs run with soniq_django.testing."""

import uuid

import pytest
from django.core.management import call_command
from django.test import Client

from example_project.shop.jobs import InventoryServiceDown, sync_inventory
from example_project.shop.models import Order
from soniq_django.models import DeadLetterJob, Job
from soniq_django.testing import immediate, run_jobs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def payments():
    from example_project.shop.payments import gateway

    gateway.reset()
    yield gateway
    gateway.reset()


def test_committed_order_queues_its_receipt(client):
    response = client.post("/orders/", {"email": "ada@example.com", "amount_cents": "4200"})
    assert response.status_code == 201
    body = response.json()
    order = Order.objects.get(pk=body["order_id"])
    row = Job.objects.get(id=body["job_id"])
    assert str(order.receipt_job_id) == body["job_id"]
    assert (row.job_name, row.queue, row.args, row.max_attempts) == (
        "shop.send_receipt", "emails", {"order_id": order.pk}, 4,
    )


def test_rolled_back_order_queues_nothing(client):
    response = client.post(
        "/orders/", {"email": "bob@example.com", "amount_cents": "100", "fail": "1"}
    )
    assert response.status_code == 409
    assert not Order.objects.exists()
    assert not Job.objects.exists()


def test_bad_input_queues_nothing(client):
    assert client.post("/orders/", {"email": "x@example.com", "amount_cents": "lots"}).status_code == 400
    assert not Job.objects.exists()


def test_demo_runs_the_example_end_to_end(capsys, payments):
    call_command("shop_demo")
    out = capsys.readouterr().out
    assert "-> 201" in out and "-> 409" in out
    receipt = Job.objects.get(job_name="shop.send_receipt")
    assert (receipt.status, receipt.result) == (
        "done", {"to": "ada@example.com", "amount_cents": 4200},
    )
    dead = DeadLetterJob.objects.get(job_name="shop.sync_inventory")
    assert (dead.dead_letter_reason, dead.attempts) == ("max_retries_exceeded", 3)
    assert "InventoryServiceDown" in dead.last_error
    assert "status=done" in out and "reason=max_retries_exceeded" in out
    # The confirmation met a provider that timed out once: two runs, one row, one charge.
    confirm = Job.objects.get(job_name="shop.confirm_order")
    assert (confirm.status, confirm.attempts) == ("done", 2)
    assert "written by run generation 2" in out and "payments charged: 1" in out


# The example's own tests of its jobs, with soniq_django.testing ----------------


def test_the_receipt_job_runs_after_the_commit():
    response = client_post("/orders/", {"email": "ada@example.com", "amount_cents": "4200"})
    (run,) = run_jobs(queues=["emails"])
    assert (str(run.job_id), run.status, run.result) == (
        response["job_id"], "done", {"to": "ada@example.com", "amount_cents": 4200})


@pytest.mark.django_db  # TestCase style: one transaction, the commit captured
def test_the_receipt_job_in_a_test_transaction(client, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/orders/", {"email": "eve@example.com", "amount_cents": "7"})
    assert [str(run.job_id) for run in run_jobs(queues=["emails"])] == [
        response.json()["job_id"]]
    assert client.get(f"/jobs/{response.json()['job_id']}/").json()["status"] == "done"


@pytest.mark.django_db
def test_the_inventory_job_retries_into_the_dead_letters(settings):
    settings.SONIQ = {"RETRY_BASE_SECONDS": 0}
    with immediate(raise_exceptions=False) as runs:
        job_id = sync_inventory.enqueue(sku="SKU-1")
    # The last attempt has none left: the runs say what the job_finished signal says.
    assert [run.outcome for run in runs] == ["retry", "retry", "dead"]
    assert runs[-1].reason == "max_retries_exceeded"
    dead = DeadLetterJob.objects.get(id=job_id)
    assert (dead.dead_letter_reason, dead.attempts) == ("max_retries_exceeded", 3)
    with pytest.raises(InventoryServiceDown):
        with immediate():
            sync_inventory.enqueue(sku="SKU-2")


@pytest.mark.django_db
def test_the_async_view_enqueues_with_aenqueue(client):
    response = client.post("/orders/async/", {"email": "zed@example.com", "amount_cents": "5"})
    assert response.status_code == 201
    job_id = response.json()["job_id"]
    assert client.get(f"/jobs/{job_id}/").json() == {
        "status": "queued", "attempts": 0, "result": None}
    (run,) = run_jobs()
    assert str(run.job_id) == job_id and run.status == "done"
    assert client.get(f"/jobs/{job_id}/").json()["result"] == {
        "to": "zed@example.com", "amount_cents": 5}
    assert client.get(f"/jobs/{uuid.uuid4()}/").status_code == 404


def client_post(path, data):
    response = Client().post(path, data)
    assert response.status_code == 201
    return response.json()


# The order's confirmation: an atomic job, and an idempotency key -------------


def test_a_placed_order_is_confirmed_and_charged_once(settings, payments):
    from example_project.shop.models import Confirmation

    settings.SONIQ = {"RETRY_BASE_SECONDS": 0}
    order_id = client_post("/orders/", {"email": "kim@example.com", "amount_cents": "990"})[
        "order_id"]
    payments.fail_after_charging(2)  # charged, then no answer: twice
    runs = run_jobs(queues=["orders"], raise_exceptions=False)
    assert [(run.job_name, run.attempt, run.outcome) for run in runs] == [
        ("shop.confirm_order", 1, "retry"), ("shop.confirm_order", 2, "retry"),
        ("shop.confirm_order", 3, "done")]
    # Each failed run wrote its Confirmation row before the provider timed
    # out: both were rolled back with their runs. The provider saw one key.
    (confirmation,) = Confirmation.objects.filter(order_id=order_id)
    (charge,) = payments.charges()
    assert (charge.amount_cents, charge.reference) == (990, confirmation.payment_reference)
    assert charge.idempotency_key == f"shop.confirm_order:{runs[0].job_id}"
    assert (confirmation.job_id, confirmation.run_generation) == (runs[0].job_id, 3)
    assert runs[-1].result == {"order_id": order_id, "payment": charge.reference}


def test_the_confirmation_commits_with_the_workers_completion(settings, payments):
    from example_project.shop.models import Confirmation
    from soniq_django.worker import Worker
    from tests.support.workers import WorkerThread

    settings.SONIQ = {"RETRY_BASE_SECONDS": 0, "POLL_INTERVAL": 0.2}
    order_id = client_post("/orders/", {"email": "lee@example.com", "amount_cents": "5"})[
        "order_id"]
    payments.fail_after_charging(1)
    assert WorkerThread(Worker(burst=True, queues=["orders"])).start().join() == 0
    row = Job.objects.get(job_name="shop.confirm_order")
    assert (row.status, row.attempts) == ("done", 2)
    assert list(Confirmation.objects.filter(order_id=order_id).values_list(
        "job_id", "run_generation")) == [(row.id, row.claim_generation)]
    assert len(payments.charges()) == 1
