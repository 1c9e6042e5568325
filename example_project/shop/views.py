"""The example views: create a record and enqueue a job only if it commits; the async twins."""

import uuid

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from soniq_django import aget_job

from .jobs import confirm_order, send_receipt
from .models import Order


class CheckoutFailed(Exception):
    """Raised on purpose (``fail=1``) to show that a rolled-back order queues nothing."""


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    """Create an order; queue its receipt e-mail and its confirmation for when it commits.

    ``shop.confirm_order`` is an atomic job: its confirmation row commits
    with the job's completion (docs/exactly-once.md).
    """
    email = request.POST.get("email", "")
    try:
        amount_cents = int(request.POST.get("amount_cents", ""))
    except ValueError:
        return JsonResponse({"error": "amount_cents must be a whole number"}, status=400)
    try:
        with transaction.atomic():
            order = Order.objects.create(email=email, amount_cents=amount_cents)
            job_id = send_receipt.enqueue_on_commit(order_id=order.pk)
            confirm_order.enqueue_on_commit(order_id=order.pk)
            order.receipt_job_id = job_id
            order.save(update_fields=["receipt_job_id"])
            if request.POST.get("fail") == "1":
                raise CheckoutFailed
    except CheckoutFailed:
        return JsonResponse({"error": "checkout failed; nothing was queued"}, status=409)
    return JsonResponse({"order_id": order.pk, "job_id": str(job_id)}, status=201)


@csrf_exempt
@require_POST
async def place_order_async(request: HttpRequest) -> JsonResponse:
    """The async flavour: create an order, then ``await`` the receipt's ``aenqueue``.

    An async view has no transaction to tie the job to (Django's ``atomic``
    is synchronous): the order and the job are two commits, so a job can
    exist for an order whose later steps failed. Put both in a synchronous
    function behind ``sync_to_async`` when they must commit together.
    """
    email = request.POST.get("email", "")
    try:
        amount_cents = int(request.POST.get("amount_cents", ""))
    except ValueError:
        return JsonResponse({"error": "amount_cents must be a whole number"}, status=400)
    order = await Order.objects.acreate(email=email, amount_cents=amount_cents)
    job_id = await send_receipt.aenqueue(order_id=order.pk)
    order.receipt_job_id = job_id
    await order.asave(update_fields=["receipt_job_id"])
    return JsonResponse({"order_id": order.pk, "job_id": str(job_id)}, status=201)


async def job_status(request: HttpRequest, job_id: uuid.UUID) -> JsonResponse:
    """Where a job is now, read with ``aget_job``; 404 when unknown or expired."""
    info = await aget_job(job_id)
    if info is None:
        return JsonResponse({"error": "no such job"}, status=404)
    return JsonResponse({"status": info.status, "attempts": info.attempts, "result": info.result})
