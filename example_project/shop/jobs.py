"""Job handlers of the example shop, found by soniq_django's autodiscovery."""

from soniq_django import job
from soniq_django.worker import current_job

from .models import Confirmation, Order
from .payments import gateway


@job(name="shop.send_receipt", queue="emails", retries=3)
def send_receipt(order_id: int) -> dict:
    """Pretend to e-mail a receipt; return what was sent."""
    order = Order.objects.get(pk=order_id)
    return {"to": order.email, "amount_cents": order.amount_cents}


class InventoryServiceDown(Exception):
    """The demo's stand-in for a remote service that never answers."""


@job(name="shop.sync_inventory", queue="inventory", retries=2)
def sync_inventory(sku: str) -> None:
    """Always fails, to show retries and the dead-letter table in the demo."""
    raise InventoryServiceDown(f"inventory service unreachable while syncing {sku}")


@job(name="shop.confirm_order", queue="orders", retries=3, atomic=True)
def confirm_order(order_id: int) -> dict:
    """Charge the order and record its confirmation: exactly once, whatever runs twice.

    Atomic: the ``Confirmation`` row commits with the job's completion or not
    at all, so a run that fails, or loses its claim, leaves no row behind.
    The charge is outside the database: it carries the job's idempotency
    key, so a second run of the job (a retry after the provider timed out)
    gets the first charge back instead of charging again.
    """
    run = current_job()
    order = Order.objects.get(pk=order_id)
    confirmation = Confirmation.objects.create(
        order=order, job_id=run.job_id, run_generation=run.generation, payment_reference="")
    # May time out after charging: the row above then rolls back with this run,
    # and the retry's charge, under the same key, is this one again.
    charge = gateway.charge(order.amount_cents,
                            idempotency_key=f"shop.confirm_order:{run.idempotency_key}")
    confirmation.payment_reference = charge.reference
    confirmation.save(update_fields=["payment_reference"])
    return {"order_id": order.pk, "payment": charge.reference}
