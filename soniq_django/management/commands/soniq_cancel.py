import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.connection import ConnectionDoesNotExist

from soniq_django import operations
from soniq_django.encoding import encodable
from soniq_django.errors import SoniqError, translating
from soniq_django.management.database import (
    add_database_argument, database_alias, migrations_required,
)
from soniq_django.management.ids import resolve_ids
from soniq_django.models import Job, JobStatus

_ACTIVE = (JobStatus.QUEUED, JobStatus.PROCESSING)


class Command(BaseCommand):
    help = (
        "Cancel jobs: a queued (or scheduled) job at once; a running one by asking its worker "
        "to stop, as the admin's action does. Jobs are chosen by id (whole, or its first 8 or "
        "more hex digits as the admin shows it) and/or by --queue and --name. Prints each job "
        "it cancels (id, name, queue; never arguments). Exits non-zero when nothing matched."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("ids", nargs="*", metavar="ID",
                            help="Job ids to cancel, whole or their first 8+ hex digits.")
        parser.add_argument("--queue", help="Only jobs in this queue (alone: all its jobs).")
        parser.add_argument("--name", dest="job_name",
                            help="Only jobs with this job name (alone: all of them).")
        parser.add_argument("--dry-run", action="store_true",
                            help="Say what would be cancelled, change nothing.")
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        if not (options["ids"] or options["queue"] or options["job_name"]):
            raise CommandError("Say which jobs to cancel: ids, --queue or --name (or several).")
        for option in ("queue", "job_name"):  # argv bytes that are not UTF-8 match no job
            if options[option] and not encodable(options[option]):
                raise CommandError(f"--{option.removeprefix('job_')} is not valid UTF-8 text")
        alias = database_alias(options)
        try:
            with migrations_required(alias):
                jobs = self._chosen(alias, options)
                if options["dry_run"]:
                    outcomes = [(job_id, _would(status))
                                for job_id, (_, _, status) in jobs.items()]
                else:
                    outcomes = list(operations.cancel_jobs(list(jobs), using=alias).outcomes)
        except (SoniqError, ConnectionDoesNotExist) as error:
            raise CommandError(f"Cancel failed: {error}") from None
        done = self._report(jobs, outcomes, options["dry_run"])
        if not done:
            raise CommandError("No job was cancelled: nothing queued or running matched."
                               if not options["dry_run"] else
                               "Nothing queued or running matched: no job would be cancelled.")

    def _chosen(self, alias: str, options: dict[str, Any]
                ) -> dict[uuid.UUID, tuple[str, str, str]]:
        """The chosen jobs in order: id -> (job name, queue, status before)."""
        rows = Job.objects.using(alias)
        if options["queue"]:
            rows = rows.filter(queue=options["queue"])
        if options["job_name"]:
            rows = rows.filter(job_name=options["job_name"])
        if options["ids"]:
            ids = resolve_ids(rows, options["ids"], kind="job" + _within(options),
                              kinds="jobs" + _within(options))
            rows = rows.filter(id__in=ids)
        else:
            ids = None
            rows = rows.filter(status__in=_ACTIVE).order_by("id")
        with translating():
            found = {job_id: (name, queue, status) for job_id, name, queue, status in
                     rows.values_list("id", "job_name", "queue", "status")}
        order = ids if ids is not None else list(found)
        return {job_id: found[job_id] for job_id in order if job_id in found}

    def _report(self, jobs: dict[uuid.UUID, tuple[str, str, str]],
                outcomes: list[tuple[uuid.UUID, str]], dry_run: bool) -> int:
        """Write one line per job and the totals; returns how many were (or would be) stopped."""
        counts = {operations.CANCELLED: 0, operations.REQUESTED: 0, operations.SKIPPED: 0}
        for job_id, outcome in outcomes:
            name, queue, status = jobs[job_id]
            counts[outcome] += 1
            what = f"{job_id} {name} (queue {queue})"
            if outcome == operations.CANCELLED:
                line = f"{'would cancel' if dry_run else 'cancelled'} {what}"
            elif outcome == operations.REQUESTED:
                line = (f"{'would ask' if dry_run else 'asked'} the worker running {what} to stop")
            else:
                line = f"skipped {what}: {_skipped(status)}"
            self.stdout.write(line)
        stopped = counts[operations.CANCELLED] + counts[operations.REQUESTED]
        prefix = "Would cancel" if dry_run else "Cancelled"
        self.stdout.write(
            f"{prefix} {counts[operations.CANCELLED]} jobs at once; "
            f"{'would ask' if dry_run else 'asked'} the workers of "
            f"{counts[operations.REQUESTED]} running jobs to stop; "
            f"skipped {counts[operations.SKIPPED]} finished ones."
        )
        return stopped


def _within(options: dict[str, Any]) -> str:
    parts = [f"in queue {options['queue']!r}" if options["queue"] else "",
             f"named {options['job_name']!r}" if options["job_name"] else ""]
    shown = " ".join(part for part in parts if part)
    return f" {shown}" if shown else ""


def _would(status: str) -> str:
    """What a cancel would do to a job in ``status`` (a lapsed lease is cancelled at once)."""
    if status == JobStatus.QUEUED:
        return operations.CANCELLED
    if status == JobStatus.PROCESSING:
        return operations.REQUESTED
    return operations.SKIPPED


def _skipped(status: str) -> str:
    """Why a job was left alone, given its status when it was chosen."""
    if status in _ACTIVE:
        return "it finished meanwhile"
    return f"already {status}"
