from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from soniq_django.grants import grant_producer
from soniq_django.management.database import (
    add_database_argument, database_alias, migrations_required,
)


class Command(BaseCommand):
    help = (
        "Let a PostgreSQL role enqueue and read jobs through soniq_enqueue, soniq_enqueue_many, "
        "soniq_enqueue_after, soniq_enqueue_after_many, soniq_get_job and soniq_args_hash, "
        "without any access to the soniq tables themselves."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("role", help="The PostgreSQL role to grant the producer functions to.")
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = database_alias(options)
        try:
            with migrations_required(alias):
                statements = grant_producer(options["role"], using=alias)
        except ValueError as error:
            raise CommandError(str(error)) from None
        except DatabaseError:
            raise CommandError(
                "Granting failed: check that the role exists and that you own the soniq functions."
            ) from None
        for statement in statements:
            self.stdout.write(statement)
