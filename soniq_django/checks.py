"""System checks: soniq.E001… for configuration that cannot work, soniq.W… for risky one.

Registered by ``SoniqConfig.ready()``. Checks tagged ``database`` run only
when Django is asked to (``manage.py check --database default``, and
``migrate``), since they query the database.

The checks follow the database routers: they look at the aliases that hold
soniq_django's tables (``soniq_aliases``), never at an application database
that a router keeps them out of (docs/deployment.md).
"""

import re
import sys
from types import FrameType
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections, router
from django.db.migrations.executor import MigrationExecutor

from . import flow, pooling
from .conf import KEYS, get_settings, problems
from .encoding import encodable
from .registry import configured_imports, import_modules, registered_handlers


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
    # soniq.E003/E004: the rules of conf.problems, which conf.checked applies
    # where a value is used (a call that needs a bad value names its check).
    found = problems(config)
    messages += [checks.Error(problem.message, hint=problem.hint, id=problem.check_id)
                 for problem in found]
    messages += _import_errors()
    bad = {problem.key for problem in found}
    if "TASK_NAME_PATTERN" in bad:
        return messages
    pattern = config.TASK_NAME_PATTERN
    lease, beat = config.LEASE_SECONDS, config.HEARTBEAT_SECONDS
    if not bad & {"LEASE_SECONDS", "HEARTBEAT_SECONDS"} and beat > lease / 2:
        messages.append(checks.Warning(
            "SONIQ['HEARTBEAT_SECONDS'] is more than half of LEASE_SECONDS.",
            hint="A single slow heartbeat would then lose the lease; a third of it is safe.",
            id="soniq.W001"))
    for name in registered_handlers():
        if not encodable(name):
            messages.append(checks.Error(
                f"The job name {name!r} holds a lone surrogate, which no database can store.",
                hint="Rename the job with @job(name=...).", id="soniq.E007"))
        elif re.fullmatch(pattern, name) is None:
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
            if _migrating_soniq():
                continue
            # A warning, not an error: a `migrate` of another app runs the
            # database checks before it applies anything, and must not be stopped.
            messages.append(checks.Warning(
                f"soniq_django migrations are not all applied on database {alias!r}.",
                hint=f"Run: python manage.py migrate soniq_django --database {alias}",
                id="soniq.W004"))
            continue
        if connection.vendor == "postgresql":
            messages += _pattern_messages(alias)
    return messages


def _migrating_soniq() -> bool:
    """Whether these checks run inside a ``migrate`` of soniq_django (or of every app).

    Django's ``migrate`` runs the database checks on the database it is
    about to migrate, before it applies anything: W004 would tell the one
    command that fixes it to run itself. No argument of a check says which
    command runs it, so this looks for Django's migrate command (or a
    subclass of it, as some apps ship) on the call stack, the same for
    ``manage.py migrate`` and ``call_command("migrate")``. A ``migrate``
    of another app alone still gets the warning: it leaves soniq's pending.
    Only walked when migrations are pending, so a clean check costs nothing.
    """
    from django.core.management.commands.migrate import Command as Migrate

    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        found = frame.f_locals
        options = found.get("options")
        if isinstance(found.get("self"), Migrate) and isinstance(options, dict):
            return options.get("app_label") in (None, "soniq_django")
        frame = frame.f_back
    return False


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


@checks.register()  # type: ignore[untyped-decorator]  # Django's, untyped here
def check_queues(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """soniq.E011 for each problem of SONIQ['QUEUES'] (flow control, docs/settings.md)."""
    config = get_settings()
    return flow.settings_messages(config.QUEUES) if config.is_dict else []
