"""Modules below the worker import none of its modules (docs/internals.md, the module map).

The steps (the worker's JobContext calls them) and wait_for_job (a web process's call) share
what the worker uses from modules below both: bounds.py, wire.py, listen.py."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "soniq_django"


def _runtime_imports(path: Path, package: str) -> set[str]:
    """Every module ``path`` imports when it runs, absolute, anywhere in it (in functions
    too), but for those under ``if TYPE_CHECKING:`` (annotations only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(inner) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                   and node.test.id == "TYPE_CHECKING"
                   for inner in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


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
              for name in _runtime_imports(path, package)
              if name.startswith("soniq_django.worker")}
    assert not upward
