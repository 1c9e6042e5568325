from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS

from soniq_django.errors import SoniqError
from soniq_django.schema.owned_metadata import downgrade_to_format1


class Command(BaseCommand):
    help = (
        "Remove the owned-queue metadata and unapply migration 0003, leaving a clean format-1 "
        "schema. Refuses while protected submissions or active owned claims remain."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--database", default=DEFAULT_DB_ALIAS, help="Database alias (default: %(default)s)."
        )

    def handle(self, *args, **options):
        try:
            done = downgrade_to_format1(options["database"])
        except SoniqError as error:
            raise CommandError(error.reason) from None
        self.stdout.write("downgraded to format 1" if done else "already format 1: nothing to do")
