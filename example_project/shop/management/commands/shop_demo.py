"""The example end to end: a view enqueues on commit, a worker runs the jobs."""

from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.test import Client, override_settings

from example_project.shop.jobs import sync_inventory
from example_project.shop.models import Confirmation
from example_project.shop.payments import gateway
from soniq_django.models import DeadLetterJob, Job


class Command(BaseCommand):
    help = (
        "Place an order that commits and one that rolls back, queue a job that always "
        "fails, run a worker in burst mode, and show where every job ended up; the "
        "order's confirmation (an atomic job) meets a payment provider that times out once."
    )

    def add_arguments(self, parser):
        parser.add_argument("--no-worker", action="store_true",
                            help="Only enqueue; do not run the worker.")

    def handle(self, *args, **options):
        client = Client()
        ok = client.post("/orders/", {"email": "ada@example.com", "amount_cents": "4200"})
        self.stdout.write(f"POST /orders/ (commits)    -> {ok.status_code} {ok.json()}")
        failed = client.post(
            "/orders/", {"email": "bob@example.com", "amount_cents": "100", "fail": "1"}
        )
        self.stdout.write(f"POST /orders/ (rolls back) -> {failed.status_code} {failed.json()}")
        sync_inventory.enqueue(sku="SKU-1")
        self.stdout.write("queued shop.sync_inventory, which always fails (2 retries)")
        gateway.fail_after_charging(1)
        self.stdout.write("the payment provider will charge the first confirmation, then time out")
        if not options["no_worker"]:
            self.stdout.write("\nmanage.py soniq_worker --burst")
            # No backoff between retries, so the demo does not wait.
            with override_settings(SONIQ={"RETRY_BASE_SECONDS": 0}):
                call_command("soniq_worker", "--burst")
        self.stdout.write("\nsoniq_jobs:")
        for row in Job.objects.order_by("created_at"):
            self.stdout.write(
                f"  {row.job_name:<20} status={row.status:<10} attempts={row.attempts} "
                f"result={row.result}"
            )
        self.stdout.write("shop_confirmation (written in shop.confirm_order's transaction):")
        for row in Confirmation.objects.order_by("id"):
            self.stdout.write(f"  order {row.order_id} payment={row.payment_reference} "
                              f"written by run generation {row.run_generation}")
        self.stdout.write(f"payments charged: {len(gateway.charges())} "
                          f"(one per idempotency key)")
        self.stdout.write("soniq_dead_letter_jobs:")
        for row in DeadLetterJob.objects.order_by("moved_to_dead_letter_at"):
            error = (row.last_error or "").strip().splitlines()[-1:] or [""]
            self.stdout.write(
                f"  {row.job_name:<20} reason={row.dead_letter_reason} attempts={row.attempts} "
                f"last error: {error[0]}"
            )
