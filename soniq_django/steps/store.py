"""The database side of durable steps: look a step up, record it under the claim's fence.

``PostgresSteps`` calls the functions of sql/steps_v1.sql; ``SqliteSteps``
is their twin in Python, inside SQLite's one write lock. Both answer the
same questions with the same values:

- ``get(fence, name)`` -> ``Lookup(held, recorded, result)``: a plain read,
  no lock taken;
- ``record(fence, name, text, size, max_bytes)`` -> True when recorded,
  False when the fence does not hold or a cancel is requested. ``last``:
  the caller's transaction (an atomic step's) ends with it, and on
  PostgreSQL its wait for the job's row and the time the backend may then
  sit idle in the transaction are bounded, as an atomic job's completion
  is (``PostgresClaims.complete_last``). ``held_since`` (SQLite): the
  caller's transaction has held the write lock since then, so the lease is
  checked as of that time (``SqliteClaims.complete``).
"""

import datetime as dt
import json
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connections

from ..errors import translate
from ..owned._store import SqliteClaims, _bounded_by, _execute, guarded
from ..owned.types import QueueClaimFence


@dataclass(frozen=True, slots=True)
class Lookup:
    """What the database holds for a step: whether the claim holds, whether the step is
    recorded, and its result (JSON, possibly None) when it is."""

    held: bool
    recorded: bool
    result: Any = None


_GET = "SELECT * FROM soniq_get_step(%s, %s, %s, %s, %s, %s)"
_RECORD = "SELECT soniq_record_step(%s, %s, %s, %s, %s, %s, %s::jsonb, %s)"


def _fence(f: QueueClaimFence) -> list[Any]:
    return [f.job_id, f.worker_id, f.generation, f.claim_token, f.queue]


class PostgresSteps:
    """Steps through soniq_get_step and soniq_record_step."""

    def __init__(self, alias: str):
        self.alias = alias

    def get(self, f: QueueClaimFence, name: str) -> Lookup:
        with guarded(self.alias, atomic=False) as connection, connection.cursor() as cursor:
            cursor.execute(_GET, _fence(f) + [name])
            held, recorded, result = cursor.fetchone()
        if isinstance(result, str):  # Django's psycopg setup leaves jsonb as text
            result = json.loads(result)
        return Lookup(bool(held), bool(recorded), result if recorded else None)

    def record(self, f: QueueClaimFence, name: str, text: str, size: int, max_bytes: int, *,
               last: tuple[float, float] | None = None, held_since: dt.datetime | None = None
               ) -> bool:
        """``last``: (lock_wait, idle_limit) of the transaction's last statement."""
        params = _fence(f) + [name, text, max_bytes]
        connection = connections[self.alias]
        if last is None:
            with guarded(self.alias, atomic=False) as connection, connection.cursor() as cursor:
                cursor.execute(_RECORD, params)
                return bool(cursor.fetchone()[0] is True)
        lock_wait, idle_limit = last
        lock_ms, idle_ms = max(1, round(lock_wait * 1000)), max(1, round(idle_limit * 1000))
        try:  # no savepoint: a failure here ends the step's whole transaction anyway
            with connection.cursor() as cursor, _bounded_by(lock_wait):
                _execute(connection, cursor, [
                    f"SELECT pg_catalog.set_config('lock_timeout', '{lock_ms}ms', true), "
                    f"pg_catalog.set_config('idle_in_transaction_session_timeout', "
                    f"'{idle_ms}ms', true)", _RECORD], params, None)
                cursor.nextset()
                return bool(cursor.fetchone()[0] is True)
        except DatabaseError as error:
            raise translate(error, self.alias) from None


class SqliteSteps:
    """soniq_get_step and soniq_record_step in Python (SQLite)."""

    def __init__(self, alias: str):
        self.alias = alias
        self.claims = SqliteClaims(alias)

    def _steps(self) -> Any:
        from ..models import JobStep

        return JobStep.objects.using(self.alias)

    def get(self, f: QueueClaimFence, name: str) -> Lookup:
        from django.utils import timezone

        with guarded(self.alias, atomic=False):
            if self.claims._owned_row(f, timezone.now()) is None:
                return Lookup(False, False)
            row = self._steps().filter(job_id=uuid.UUID(f.job_id), name=name).values_list(
                "result", flat=True)
            found = list(row[:1])
        return Lookup(True, True, found[0]) if found else Lookup(True, False)

    def record(self, f: QueueClaimFence, name: str, text: str, size: int, max_bytes: int, *,
               last: tuple[float, float] | None = None, held_since: dt.datetime | None = None
               ) -> bool:
        from ..errors import ConfigValidationError, ErrorCode

        if size > max_bytes:  # soniq_record_step's own check, for a caller that skipped ours
            raise ConfigValidationError("the step result is larger than max_bytes",
                                        code=ErrorCode.STEP_TOO_LARGE)
        with self.claims._locked() as now:
            row = self.claims._owned_row(f, now if held_since is None else held_since)
            if row is None or row.cancel_requested:
                return False
            steps = self._steps()
            job_id = uuid.UUID(f.job_id)
            if steps.filter(job_id=job_id, name=name).exists():
                raise ConfigValidationError("this step is already recorded for the job",
                                            code=ErrorCode.STEP_DUPLICATE)
            steps.create(job_id=job_id, name=name, result=json.loads(text), size=size,
                         attempt=row.attempts, generation=f.generation, recorded_at=now)
            return True


def steps_for(alias: str) -> PostgresSteps | SqliteSteps:
    """The step store of this database alias."""
    if connections[alias].vendor == "postgresql":
        return PostgresSteps(alias)
    return SqliteSteps(alias)
