"""Model fields of soniq_django's own."""

import json
from typing import Any

from django.core import exceptions
from django.db import models


class QueueListField(models.Field):
    """A list of queue names: ``text[]`` on PostgreSQL, JSON text on SQLite.

    ``soniq_workers.queues`` is a ``text[]`` in Soniq's own schema, and
    Soniq's worker writes it as a PostgreSQL array, so a ``jsonb`` column
    would not take its rows. SQLite has no arrays; there the same list is
    stored as a JSON array, as ``JSONField`` would. Python sees ``list[str]``
    (or ``None``) on both.

    The column's database default (``'{}'`` on PostgreSQL, as Soniq declares
    it) is written by the migration that creates the column, not declared
    here: the ORM always sends a value.
    """

    description = "List of queue names"
    empty_strings_allowed = False

    def db_type(self, connection: Any) -> str:
        return "text[]" if connection.vendor == "postgresql" else "text"

    def to_python(self, value: Any) -> list[str] | None:
        if value is None:
            return None
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise exceptions.ValidationError("Enter a JSON array of queue names.") from None
        if not isinstance(value, (list, tuple)) or not all(isinstance(q, str) for q in value):
            raise exceptions.ValidationError("Queue names must be a list of strings.")
        return list(value)

    def get_prep_value(self, value: Any) -> list[str] | None:
        value = super().get_prep_value(value)
        return None if value is None else self.to_python(value)

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        if not prepared:
            value = self.get_prep_value(value)
        if value is None or connection.vendor == "postgresql":
            return value  # psycopg sends a Python list as an array
        return json.dumps(value)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        if value is None or isinstance(value, list):
            return value
        return json.loads(value)

    def value_to_string(self, obj: Any) -> str:
        return json.dumps(self.value_from_object(obj))
