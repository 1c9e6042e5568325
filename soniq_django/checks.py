"""System checks: soniq.E001… for configuration that cannot work, soniq.W… for risky one.

Registered by ``SoniqConfig.ready()``. Checks tagged ``database`` run only
when Django is asked to (``manage.py check --database default``, and
``migrate``), since they query the database.

The checks follow the database routers: they look at the aliases that hold
soniq_django's tables (``soniq_aliases``), never at an application database
that a router keeps them out of (docs/deployment.md).
"""

import numbers
import re
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections, router
from django.db.migrations.executor import MigrationExecutor

from . import pooling
from .conf import KEYS, Settings, get_settings
from .registry import configured_imports, import_modules, registered_handlers

_POSITIVE = ("LEASE_SECONDS", "HEARTBEAT_SECONDS", "POLL_INTERVAL")
_NOT_NEGATIVE = ("RESULT_TTL", "RETRY_BASE_SECONDS", "RETRY_MAX_SECONDS",
                 "UNKNOWN_JOB_GRACE_SECONDS")
_INTEGERS = ("DEFAULT_PRIORITY", "DEFAULT_MAX_ATTEMPTS")
_DEFAULT = Settings()


def _number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _value_errors(config: Settings) -> list[checks.CheckMessage]:
    """soniq.E003 for each value of the wrong type or range (a default is always right)."""
    errors = []
    for key in _POSITIVE:
        value = getattr(config, key)
        if not (_number(value) and value > 0):
            errors.append(checks.Error(
                f"SONIQ[{key!r}] must be a positive number of seconds.",
                hint=f"The default is {getattr(_DEFAULT, key)}.", id="soniq.E003"))
    for key in _NOT_NEGATIVE:
        value = getattr(config, key)
        if not (_number(value) and value >= 0):
            errors.append(checks.Error(
                f"SONIQ[{key!r}] must be a number of seconds, 0 or more.",
                hint=f"The default is {getattr(_DEFAULT, key)}.", id="soniq.E003"))
    for key in _INTEGERS:
        if type(getattr(config, key)) is not int:
            errors.append(checks.Error(f"SONIQ[{key!r}] must be a whole number.",
                                       hint=f"The default is {getattr(_DEFAULT, key)}.",
                                       id="soniq.E003"))
    if type(config.DEFAULT_MAX_ATTEMPTS) is int and config.DEFAULT_MAX_ATTEMPTS < 1:
        errors.append(checks.Error("SONIQ['DEFAULT_MAX_ATTEMPTS'] must be at least 1.",
                                   hint="It counts the first attempt too.", id="soniq.E003"))
    timeout = config.JOB_TIMEOUT_SECONDS
    if timeout is not None and not (_number(timeout) and timeout > 0):
        errors.append(checks.Error("SONIQ['JOB_TIMEOUT_SECONDS'] must be None or a positive number.",
                                   id="soniq.E003"))
    prepared = config.PREPARED_STATEMENTS
    if prepared is not None and type(prepared) is not bool:
        errors.append(checks.Error("SONIQ['PREPARED_STATEMENTS'] must be None, True or False.",
                                   hint="None (the default) prepares them only on a connection "
                                        "straight to the server.", id="soniq.E003"))
    queue = config.DEFAULT_QUEUE
    if not isinstance(queue, str) or not queue or len(queue) > 255:
        errors.append(checks.Error("SONIQ['DEFAULT_QUEUE'] must be a queue name (1-255 characters).",
                                   id="soniq.E003"))
    imports = config.IMPORTS
    if not isinstance(imports, (list, tuple)) or not all(
            isinstance(name, str) and name for name in imports):
        errors.append(checks.Error("SONIQ['IMPORTS'] must be a list of module names.",
                                   hint='For example ["shop.tasks", "billing.handlers"].',
                                   id="soniq.E003"))
    return errors


def _import_errors() -> list[checks.CheckMessage]:
    """soniq.E009 for each module of SONIQ['IMPORTS'] that cannot be imported."""
    return [checks.Error(
        f"SONIQ['IMPORTS'] names the module {name!r}, which cannot be imported ({error}).",
        hint=f"Fix the module path or the module (python -c 'import {name}' shows why); "
             "soniq_worker does not start until it imports.",
        id="soniq.E009") for name, error in import_modules(configured_imports())]


@checks.register()  # type: ignore[untyped-decorator]  # Django's, untyped here
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    config = get_settings()
    if not config.is_dict:
        return [checks.Error("settings.SONIQ must be a dict.", hint="For example SONIQ = {}.",
                             id="soniq.E001")]
    messages = []
    unknown = sorted(map(str, config.configured - set(KEYS)))
    if unknown:
        messages.append(checks.Error(
            f"Unknown SONIQ setting(s): {', '.join(unknown)}.",
            hint=f"Known settings: {', '.join(sorted(KEYS))}.", id="soniq.E002"))
    messages += _value_errors(config)
    messages += _import_errors()
    pattern = config.TASK_NAME_PATTERN
    try:
        re.compile(pattern)
    except (re.error, TypeError):
        messages.append(checks.Error("SONIQ['TASK_NAME_PATTERN'] is not a valid regular expression.",
                                     id="soniq.E004"))
        return messages
    lease, beat = config.LEASE_SECONDS, config.HEARTBEAT_SECONDS
    if _number(lease) and _number(beat) and lease > 0 and beat > lease / 2:
        messages.append(checks.Warning(
            "SONIQ['HEARTBEAT_SECONDS'] is more than half of LEASE_SECONDS.",
            hint="A single slow heartbeat would then lose the lease; a third of it is safe.",
            id="soniq.W001"))
    for name in registered_handlers():
        if re.fullmatch(pattern, name) is None:
            messages.append(checks.Error(
                f"The job name {name!r} does not match SONIQ['TASK_NAME_PATTERN'].",
                hint="Rename the job with @job(name=...) or widen the pattern.", id="soniq.E007"))
    if config.REQUIRE_SQL_API:
        for alias in soniq_aliases(reads=True):
            if connections[alias].vendor != "postgresql":
                messages.append(checks.Error(
                    f"SONIQ['REQUIRE_SQL_API'] is set but database {alias!r} is not PostgreSQL.",
                    hint="The SQL producer API (soniq_enqueue, …) exists on PostgreSQL only.",
                    id="soniq.E008"))
    writes = soniq_aliases(reads=False)
    for alias in soniq_aliases(reads=True):
        messages += _backend_messages(alias, writes=alias in writes)
    return messages + _router_messages() + pooling.settings_messages(config)


def soniq_aliases(*, reads: bool) -> list[str]:
    """The aliases that hold soniq_django's tables, in ``DATABASES`` order.

    Those where the routers let its migrations run, plus the routers' write
    alias for its models and, with ``reads``, their read alias. Without
    routers that is every alias.
    """
    from .models import Job

    picked = {router.db_for_write(Job)}
    if reads:
        picked.add(router.db_for_read(Job))
    return [alias for alias in settings.DATABASES
            if alias in picked or router.allow_migrate_model(alias, Job)]


def _router_messages() -> list[checks.CheckMessage]:
    """soniq.W005 when the routers write jobs where they keep soniq's migrations out."""
    from .models import Job

    alias = router.db_for_write(Job)
    if alias not in settings.DATABASES or router.allow_migrate_model(alias, Job):
        return []
    return [checks.Warning(
        f"The database routers send soniq_django's writes to {alias!r} but do not let its "
        "migrations run there.",
        hint="Let allow_migrate() return True for app 'soniq_django' on that alias (see "
             "docs/deployment.md), unless its tables are made there some other way.",
        id="soniq.W005")]


def _backend_messages(alias: str, *, writes: bool) -> list[checks.CheckMessage]:
    connection = connections[alias]
    if connection.vendor not in ("postgresql", "sqlite"):
        return [checks.Error(f"Database {alias!r} is {connection.vendor}; soniq_django supports "
                             "PostgreSQL and SQLite.", id="soniq.E005")]
    if connection.vendor == "sqlite" and writes:
        mode = connection.settings_dict.get("OPTIONS", {}).get("transaction_mode")
        if mode != "IMMEDIATE":
            return [checks.Warning(
                f"SQLite database {alias!r} does not open transactions in IMMEDIATE mode.",
                hint='Add "OPTIONS": {"transaction_mode": "IMMEDIATE"} so that concurrent '
                     "writers wait for each other instead of failing (see docs/settings.md).",
                id="soniq.W002")]
    return []


@checks.register(checks.Tags.database)  # type: ignore[untyped-decorator]  # Django's, untyped
def check_database(app_configs: Any = None, databases: Any = None, **kwargs: Any
                   ) -> list[checks.CheckMessage]:
    """soniq.W004 and soniq.W003 for each alias asked about where soniq's migrations run."""
    from .models import Job

    messages = []
    for alias in databases or []:
        if not router.allow_migrate_model(alias, Job):
            # The routers keep soniq's tables elsewhere: `migrate` records
            # its migrations here without running them, so there is
            # nothing to apply and no SQL function to ask.
            continue
        connection = connections[alias]
        if connection.vendor == "postgresql":
            messages += pooling.database_messages(alias, get_settings())
        executor = MigrationExecutor(connection)
        targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == "soniq_django"]
        if executor.migration_plan(targets):
            # A warning, not an error: `migrate` itself runs the database
            # checks before it applies anything, and must not be stopped.
            messages.append(checks.Warning(
                f"soniq_django migrations are not all applied on database {alias!r}.",
                hint=f"Run: python manage.py migrate soniq_django --database {alias}",
                id="soniq.W004"))
            continue
        if connection.vendor == "postgresql":
            messages += _pattern_messages(alias)
    return messages


def _pattern_messages(alias: str) -> list[checks.CheckMessage]:
    pattern = get_settings().TASK_NAME_PATTERN
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT soniq_task_name_pattern_v1()")
        (database_pattern,) = cursor.fetchone()
    if database_pattern == pattern:
        return []
    return [checks.Warning(
        f"SONIQ['TASK_NAME_PATTERN'] differs from the pattern database {alias!r} enforces.",
        hint="Producers in other languages are checked against the database's pattern. Run: "
             "ALTER DATABASE <name> SET soniq.task_name_pattern = '<your pattern>'",
        id="soniq.W003")]
