"""Shared helpers for the stateful model tests (tests/protocol/test_*_state_machine.py).

``stateful_settings``: the sizes, which ``SONIQ_STATEFUL_EXAMPLES`` and
``SONIQ_STATEFUL_STEPS`` override, and the health checks a model on the real
database trips. ``empty_tables``: every job and dead letter deleted, with
the models given, the protection trigger's gate open. ``install_function``:
a SQL function definition (a released one, or one broken on purpose to show
that a model finds the defect) loaded into the test schema. ``failure_text``:
what a model's failure says, a flaky one's included.
"""

import os

from django.db import connection, transaction
from hypothesis import HealthCheck, settings

from soniq_django.models import DeadLetterJob, Job


def stateful_settings(examples: int, steps: int) -> settings:
    """``examples`` examples of at most ``steps`` rules each (the defaults), no deadline."""
    return settings(
        max_examples=int(os.environ.get("SONIQ_STATEFUL_EXAMPLES", str(examples))),
        stateful_step_count=int(os.environ.get("SONIQ_STATEFUL_STEPS", str(steps))),
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                               HealthCheck.filter_too_much])


def empty_tables(*models) -> None:
    """Delete every job, dead letter and row of ``models``, in that order, in one transaction."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('soniq.fenced_write', 'on', true)")
        Job.objects.all().delete()
        DeadLetterJob.objects.all().delete()
        for model in models:
            model.objects.all().delete()


def install_function(definition: str) -> None:
    """Load ``definition`` (``{schema}`` placeholders) into the test schema (PostgreSQL)."""
    from soniq_django.sql import fill_schema

    with connection.cursor() as cursor:
        cursor.execute("SELECT quote_ident(current_schema())")
        (schema,) = cursor.fetchone()
        cursor.execute(fill_schema(definition, schema))


def failure_text(error: BaseException) -> str:
    """The message of ``error`` and of every exception it groups: a model that finds a race
    may not find it again when Hypothesis replays the example, and then raises Flaky, an
    exception group whose own message only says so; the model's words are in its members."""
    parts = [str(error)]
    for member in getattr(error, "exceptions", ()):
        parts.append(failure_text(member))
    return "\n".join(parts)
