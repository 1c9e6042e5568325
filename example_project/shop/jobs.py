"""Job handlers of the example shop, found by soniq_django's autodiscovery."""

from soniq_django import job

from .models import Order


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
