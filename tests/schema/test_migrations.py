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
