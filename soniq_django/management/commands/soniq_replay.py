from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.connection import ConnectionDoesNotExist

from soniq_django.errors import SoniqError
from soniq_django.management.database import (
    add_database_argument, database_alias, migrations_required,
)
from soniq_django.management.ids import resolve_ids
from soniq_django.models import DeadLetterJob
from soniq_django.replay import replay_dead_letters


class Command(BaseCommand):
    help = (
        "Put dead-lettered jobs back in the queue (same id, args unchanged, a fresh attempt "
        "budget), by id (whole, or its first 8 or more hex digits as the admin shows it), by "
        "dead-letter reason, or all. Prints counts, never job arguments."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("ids", nargs="*", metavar="ID",
                            help="Job ids to replay, whole or their first 8+ hex digits.")
        parser.add_argument("--reason", help=(
            "Replay every dead letter with this reason: max_retries_exceeded, "
            "permanent_failure, job_not_found or invalid_arguments."))
        parser.add_argument("--all", action="store_true", help="Replay every dead letter.")
        parser.add_argument("--dry-run", action="store_true", help="Count, change nothing.")
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = database_alias(options)
        ids = None
        try:
            with migrations_required(alias):
                if options["ids"]:
                    ids = resolve_ids(DeadLetterJob.objects.using(alias), options["ids"],
                                      kind="dead letter", kinds="dead letters")
                report = replay_dead_letters(
                    alias, ids=ids, reason=options["reason"],
                    all=options["all"], dry_run=options["dry_run"], progress=self._progress,
                )
            if self.stdout.isatty():
                self.stdout.write("")  # end the progress line
        except (ValueError, SoniqError, ConnectionDoesNotExist) as error:
            raise CommandError(f"Replay failed: {error}") from None
        verb = "Would replay" if report.dry_run else "Replayed"
        self.stdout.write(f"{verb} {len(report.replayed)} dead-lettered jobs.")
        self.stdout.write(
            f"Skipped {len(report.live)} already in the queue, {len(report.already_replayed)} "
            f"replayed and not failed since, {len(report.conflicts)} refused by a constraint; "
            f"{len(report.missing)} ids not found."
        )

    def _progress(self, handled: int) -> None:
        # On a terminal one line is rewritten; in a log every step is a line.
        if self.stdout.isatty():
            self.stdout.write(f"\r... {handled} dead letters handled", ending="")
            self.stdout.flush()
        else:
            self.stdout.write(f"... {handled} dead letters handled")
