"""Migrations match the models, and import only frozen helpers."""

import sys
from pathlib import Path

import pytest
from django.core.management import call_command

import soniq_django
from tests.support.imports import imports

MIGRATIONS = Path(soniq_django.__file__).parent / "migrations"
SCHEMA = Path(soniq_django.__file__).parent / "schema"
# What a released migration may run: Django, the standard library, the
# released SQL files, the frozen helpers of soniq_django.schema, and the one
# field class the migration files name.
FROZEN = ("soniq_django.sql", "soniq_django.schema", "soniq_django.fields")


@pytest.mark.django_db
def test_no_missing_migrations():
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def _allowed(module: str, frozen: tuple[str, ...]) -> bool:
    top = module.partition(".")[0]
    if top == "django" or top in sys.stdlib_module_names:
        return True
    return any(module == name or module.startswith(name + ".") for name in frozen)


@pytest.mark.parametrize("path", sorted(MIGRATIONS.glob("0*.py")), ids=lambda p: p.stem)
def test_a_migration_imports_only_frozen_helpers(path):
    """A later refactor of the live package cannot change what a released migration does."""
    live = [m for m in imports(path, "soniq_django.migrations") if not _allowed(m, FROZEN)]
    assert not live, f"{path.name} imports live modules: {sorted(live)}"


@pytest.mark.parametrize("path", sorted(SCHEMA.glob("*.py")), ids=lambda p: p.stem)
def test_the_frozen_helpers_import_only_each_other_and_errors(path):
    frozen = ("soniq_django.schema", "soniq_django.errors")
    live = [m for m in imports(path, "soniq_django.schema") if not _allowed(m, frozen)]
    assert not live, f"schema/{path.name} imports live modules: {sorted(live)}"


def _operations(operations):
    from django.db.migrations import SeparateDatabaseAndState

    for operation in operations:
        if isinstance(operation, SeparateDatabaseAndState):
            yield from _operations(operation.database_operations)
        else:
            yield operation


@pytest.mark.parametrize("path", sorted(MIGRATIONS.glob("0*.py")), ids=lambda p: p.stem)
def test_a_migrations_python_steps_do_not_render_the_historical_models(path):
    """Django's RunPython renders every app's models before each step; ours read none."""
    from django.db.migrations import RunPython

    from soniq_django.schema.operations import RunWithoutModels

    module = __import__(f"soniq_django.migrations.{path.stem}", fromlist=["Migration"])
    steps = [op for op in _operations(module.Migration.operations) if isinstance(op, RunPython)]
    assert all(type(op) is RunWithoutModels for op in steps), [type(op) for op in steps]


@pytest.mark.django_db(transaction=True)
def test_migrating_up_does_not_render_the_project_models_again_for_each_sql_step(
        monkeypatch, at_latest_afterwards):
    """0002 to the latest migration: the models are rendered for Django's own schema steps,
    not again, all of them, before each of the 40-odd steps that run SQL (that was about
    1,000 model renders and 2 of the 2.8 seconds of this migrate on PostgreSQL)."""
    from django.db.migrations import state

    from tests.support.schema import migrate

    migrate("0002")
    renders = []
    real = state.ModelState.render

    def counted(self, apps):
        renders.append(self.name)
        return real(self, apps)

    monkeypatch.setattr(state.ModelState, "render", counted)
    migrate()
    # About 110 on both databases (Django's own schema steps render the models they
    # touch); 1,060-1,090 with Django's RunPython. The limit leaves room for new steps.
    assert len(renders) <= 250, len(renders)
