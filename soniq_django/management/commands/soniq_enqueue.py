import datetime as dt
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from soniq_django.conf import DEFAULT_MAX_ATTEMPTS
from soniq_django.errors import SoniqError
from soniq_django.management.database import add_database_argument, database_alias
from soniq_django.producer import enqueue


def _run_at(text: str | None) -> dt.datetime | None:
    if text is None:
        return None
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise CommandError("--run-at must be an ISO 8601 time, e.g. 2026-12-01T09:00:00+00:00")
    if moment.tzinfo is None:
        raise CommandError("--run-at needs a time zone offset, e.g. +00:00")
    return moment


class Command(BaseCommand):
    help = (
        "Queue one job by name, like the SQL function soniq_enqueue. The job name does not "
        "need a handler in this project. Prints the job's id."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job_name", help="The job's name, e.g. billing.send_invoice.")
        parser.add_argument("--args", dest="job_args", default="{}",
                            help='Keyword arguments as a JSON object, e.g. \'{"order_id": 1}\'.')
        parser.add_argument("--queue", help="Queue name (default: SONIQ['DEFAULT_QUEUE']).")
        parser.add_argument("--priority", type=int, help="Lower runs first (default 100).")
        when = parser.add_mutually_exclusive_group()
        when.add_argument("--run-at", help="Not before this ISO 8601 time (with offset).")
        when.add_argument("--delay", type=float, metavar="SECONDS",
                          help="Not before this many seconds from now, by the database's clock.")
        parser.add_argument("--max-attempts", type=int, default=DEFAULT_MAX_ATTEMPTS,
                            help="Attempts allowed, retries plus one (default %(default)s).")
        parser.add_argument("--unique", action="store_true",
                            help="Return the id of an equal queued job instead of adding one.")
        parser.add_argument("--dedup-key", help="Return the queued job with this key, if any.")
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            job_args = json.loads(options["job_args"])
        except json.JSONDecodeError:
            raise CommandError("--args is not valid JSON") from None
        try:
            job_id = enqueue(
                options["job_name"], job_args, queue=options["queue"],
                priority=options["priority"], run_at=_run_at(options["run_at"]),
                delay=options["delay"],
                max_attempts=options["max_attempts"], unique_job=options["unique"],
                dedup_key=options["dedup_key"], producer_id="manage.py soniq_enqueue",
                using=database_alias(options),
            )
        except SoniqError as error:
            raise CommandError(str(error)) from None
        self.stdout.write(str(job_id))
