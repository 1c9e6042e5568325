from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from soniq_django.errors import SoniqError
from soniq_django.management.database import add_database_argument, database_alias
from soniq_django.schema.owned_metadata import downgrade_to_format1


class Command(BaseCommand):
    help = (
        "Remove the owned-queue metadata and unapply migration 0003, leaving a clean format-1 "
        "schema. Refuses while protected submissions or active owned claims remain."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            done = downgrade_to_format1(database_alias(options))
        except SoniqError as error:
            raise CommandError(error.reason) from None
        self.stdout.write("downgraded to format 1" if done else "already format 1: nothing to do")
