"""Shared helpers for the owned-queue tests."""

import secrets

from django.db import connection

from soniq_django.models import Job


def nonce() -> str:
    return secrets.token_hex(16)


def rewrite(job_id, **values) -> None:
    """Change a job row behind the API's back (test set-up only).

    On PostgreSQL the protection trigger skips writes to owned rows unless
    the gate is open, exactly as it does for an old worker's UPDATE.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('soniq.fenced_write', 'on', false)")
    try:
        assert Job.objects.filter(id=job_id).update(**values) == 1
    finally:
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('soniq.fenced_write', 'off', false)")
