from django.db import models


class Order(models.Model):
    """An order placed through the example view."""

    email = models.EmailField()
    amount_cents = models.PositiveIntegerField()
    receipt_job_id = models.UUIDField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"order {self.pk} for {self.email}"


class Confirmation(models.Model):
    """An order's confirmation, written by ``shop.confirm_order`` in its job's transaction.

    The job is atomic: this row and the job's completion commit together, so
    exactly one run's row exists, however often the job ran. There is no
    unique constraint on ``order`` on purpose: the example's tests count the
    rows, and a duplicate would show.
    """

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="confirmations")
    job_id = models.UUIDField()
    run_generation = models.BigIntegerField()
    payment_reference = models.CharField(max_length=64)
    confirmed_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"confirmation of order {self.order_id} ({self.payment_reference})"
