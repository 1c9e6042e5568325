"""Drive the example view and show what soniq_django queued."""

from django.core.management.base import BaseCommand
from django.test import Client

from soniq_django.models import Job


class Command(BaseCommand):
    help = "Place one order that commits and one that rolls back, then list the queued jobs."

    def handle(self, *args, **options):
        client = Client()
        ok = client.post("/orders/", {"email": "ada@example.com", "amount_cents": "4200"})
        self.stdout.write(f"POST /orders/ (commits)    -> {ok.status_code} {ok.json()}")
        failed = client.post(
            "/orders/", {"email": "bob@example.com", "amount_cents": "100", "fail": "1"}
        )
        self.stdout.write(f"POST /orders/ (rolls back) -> {failed.status_code} {failed.json()}")
        self.stdout.write("\nJobs in soniq_jobs (newest first):")
        for row in Job.objects.order_by("-created_at")[:10]:
            self.stdout.write(
                f"  {row.id}  {row.job_name:<20} queue={row.queue:<8} "
                f"status={row.status:<10} args={row.args}"
            )
