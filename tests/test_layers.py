"""Modules below the worker import none of its modules (docs/internals.md, the module map).

The steps (the worker's JobContext calls them) and wait_for_job (a web process's call) share
what the worker uses from modules below both: bounds.py, wire.py, listen.py."""

from pathlib import Path

from tests.support.imports import imports

PACKAGE = Path(__file__).resolve().parents[1] / "soniq_django"


#: The modules below the worker, as (folder or file, its package).
BELOW_THE_WORKER = [("steps", "soniq_django.steps"), ("bounds.py", "soniq_django"),
                    ("wire.py", "soniq_django"), ("listen.py", "soniq_django"),
                    ("waiting.py", "soniq_django")]


def test_the_modules_below_the_worker_import_none_of_its_modules():
    modules = {}
    for name, package in BELOW_THE_WORKER:
        path = PACKAGE / name
        for found in (sorted(path.glob("*.py")) if path.is_dir() else [path]):
            modules[found] = package
    assert len(modules) >= 7
    upward = {f"{path.relative_to(PACKAGE)}: {name}"
              for path, package in modules.items()
              for name in imports(path, package, runtime_only=True)
              if name.startswith("soniq_django.worker")}
    assert not upward
