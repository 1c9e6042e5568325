"""The example view: create a record and enqueue a job only if it commits."""

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from .jobs import send_receipt
from .models import Order


class CheckoutFailed(Exception):
    """Raised on purpose (``fail=1``) to show that a rolled-back order queues nothing."""


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    """Create an order and queue its receipt e-mail for when the order commits."""
    email = request.POST.get("email", "")
    try:
        amount_cents = int(request.POST.get("amount_cents", ""))
    except ValueError:
        return JsonResponse({"error": "amount_cents must be a whole number"}, status=400)
    try:
        with transaction.atomic():
            order = Order.objects.create(email=email, amount_cents=amount_cents)
            job_id = send_receipt.enqueue_on_commit(order_id=order.pk)
            order.receipt_job_id = job_id
            order.save(update_fields=["receipt_job_id"])
            if request.POST.get("fail") == "1":
                raise CheckoutFailed
    except CheckoutFailed:
        return JsonResponse({"error": "checkout failed; nothing was queued"}, status=409)
    return JsonResponse({"order_id": order.pk, "job_id": str(job_id)}, status=201)
