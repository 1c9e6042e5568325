import datetime as dt
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.connection import ConnectionDoesNotExist

from soniq_django.errors import SoniqError
from soniq_django.housekeeping import purge_dead_letters, purge_expired
from soniq_django.management.database import (
    add_database_argument, database_alias, migrations_required,
)


class Command(BaseCommand):
    help = (
        "Delete finished jobs whose result expired (never protected owned submissions); "
        "optionally also dead letters older than a number of days."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_argument(parser)
        parser.add_argument("--batch", type=int, default=1000, help="Rows per transaction.")
        parser.add_argument("--dead-letters-older-than", type=float, metavar="DAYS",
                            help="Also delete unprotected dead letters older than DAYS.")

    def handle(self, *args: Any, **options: Any) -> None:
        using, days = database_alias(options), options["dead_letters_older_than"]
        try:
            with migrations_required(using):
                purged = purge_expired(using, batch=options["batch"], progress=self._progress)
                if self.stdout.isatty() and purged:
                    self.stdout.write("")  # end the progress line
                self.stdout.write(f"Purged {purged} expired job rows.")
                if days is not None:
                    gone = purge_dead_letters(using, older_than=dt.timedelta(days=days))
                    self.stdout.write(f"Purged {gone} dead letters older than {days:g} days.")
        except (ValueError, OverflowError, SoniqError, ConnectionDoesNotExist) as error:
            raise CommandError(f"Purge failed: {error}") from None

    def _progress(self, total: int) -> None:
        # On a terminal one line is rewritten; in a log every batch is a line.
        if self.stdout.isatty():
            self.stdout.write(f"\r... {total} purged so far", ending="")
            self.stdout.flush()
        else:
            self.stdout.write(f"... {total} purged so far")
