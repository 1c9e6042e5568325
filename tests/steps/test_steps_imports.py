"""The steps sit below the worker: the worker's JobContext calls them, they import no worker
module (docs/internals.md, the module map). What both need is below both: bounds.py."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "soniq_django"


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


def test_the_steps_and_the_bounds_import_no_worker_module():
    modules = {path: "soniq_django.steps" for path in (PACKAGE / "steps").glob("*.py")}
    modules[PACKAGE / "bounds.py"] = "soniq_django"
    assert len(modules) >= 4
    upward = {f"{path.relative_to(PACKAGE)}: {name}"
              for path, package in modules.items()
              for name in _runtime_imports(path, package)
              if name.startswith("soniq_django.worker")}
    assert not upward
