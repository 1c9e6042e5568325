from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from soniq_django.grants import GRANTS, grant
from soniq_django.management.database import (
    add_database_argument, database_alias, migrations_required,
)


class Command(BaseCommand):
    help = (
        "Let a PostgreSQL role call the soniq SQL API, without any access to the soniq tables "
        "themselves: --producer (the default) enqueues and reads jobs (soniq_enqueue, "
        "soniq_enqueue_many, soniq_enqueue_after, soniq_enqueue_after_many, "
        "soniq_enqueue_keyed, soniq_get_job, soniq_args_hash); --worker registers, claims "
        "and settles them (the claim protocol); both may be given."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("role", help="The PostgreSQL role to grant the functions to.")
        parser.add_argument("--producer", action="store_true",
                            help="Grant the producer functions (the default).")
        parser.add_argument("--worker", action="store_true",
                            help="Grant the worker functions (docs/claim-protocol.md).")
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = database_alias(options)
        kinds = [kind for kind in GRANTS if options[kind]] or ["producer"]
        functions = tuple(function for kind in kinds for function in GRANTS[kind])
        try:
            with migrations_required(alias):
                statements = grant(options["role"], functions, using=alias)
        except ValueError as error:
            raise CommandError(str(error)) from None
        except DatabaseError:
            raise CommandError(
                "Granting failed: check that the role exists and that you own the soniq functions."
            ) from None
        for statement in statements:
            self.stdout.write(statement)
