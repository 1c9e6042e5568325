from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from soniq_django.management.database import (
    add_database_argument, database_alias, migrations_required,
)
from soniq_django.retirement import count_retirable, cutoff_for, retire_submissions


class Command(BaseCommand):
    help = (
        "Retire the identity of protected owned submissions on terminal rows (done, cancelled, "
        "dead letters) last changed more than DAYS ago. A dry run unless --confirm is given."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", type=int, required=True, metavar="DAYS",
                            help="Only rows last changed more than DAYS days ago.")
        parser.add_argument("--confirm", action="store_true",
                            help="Retire them; without it, only count what would be retired.")
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            cutoff = cutoff_for(timedelta(days=options["older_than"]))
        except ValueError as error:
            raise CommandError(f"--older-than: {error}") from None
        using = database_alias(options)
        with migrations_required(using):
            self._retire(cutoff, using, confirm=options["confirm"])

    def _retire(self, cutoff: datetime, using: str, *, confirm: bool) -> None:
        self.stdout.write(f"cut-off: last changed before {cutoff:%Y-%m-%d %H:%M:%S} UTC")
        if not confirm:
            for group in count_retirable(cutoff, using=using):
                verdict = "would be retired" if group.eligible else "live, never retired"
                self.stdout.write(f"{group.table} {group.status}: {group.rows} {verdict}")
            self.stdout.write("dry run: nothing changed; add --confirm to retire")
            return
        for group in retire_submissions(cutoff, using=using, progress=self._progress):
            self.stdout.write(f"{group.table} {group.status}: {group.rows} retired")

    def _progress(self, table: str, status: str, done: int, total: int) -> None:
        # A terminal gets one line rewritten in place; a pipe or file gets plain lines.
        if self.stdout.isatty():
            self.stdout.write(f"\r{table} {status}: {done}/{total}", ending="")
            if done >= total:
                self.stdout.write("")
        else:
            self.stdout.write(f"{table} {status}: {done}/{total}")
