"""The example project's view enqueues on commit, and only then."""

import pytest
from django.core.management import call_command

from example_project.shop.models import Order
from soniq_django.models import DeadLetterJob, Job

pytestmark = pytest.mark.django_db(transaction=True)


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


def test_demo_runs_the_example_end_to_end(capsys):
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
