from django.db import models


class Order(models.Model):
    """An order placed through the example view."""

    email = models.EmailField()
    amount_cents = models.PositiveIntegerField()
    receipt_job_id = models.UUIDField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"order {self.pk} for {self.email}"
