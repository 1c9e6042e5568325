from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from soniq_django.management.database import add_database_argument, database_alias
from soniq_django.schema.admission import check_report


class Command(BaseCommand):
    help = (
        "Check the owned-queue schema (migration 0003) against the admission rules: before "
        "0003, what already exists; after it, that everything is exactly as required."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        lines, problems = check_report(connections[database_alias(options)])
        for line in lines:
            self.stdout.write(line)
        if problems:
            raise CommandError(
                f"{len(problems)} problem(s):\n" + "\n".join(p.message for p in problems)
            )
