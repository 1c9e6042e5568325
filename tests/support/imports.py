"""What a module imports, read from its source (no import runs): for the layering tests."""

import ast
from pathlib import Path


def imports(path: Path, package: str, *, runtime_only: bool = False) -> set[str]:
    """Every module ``path`` (of ``package``) imports, absolute, anywhere in it (in functions
    too), with ``from pkg import name`` as ``pkg.name``. ``runtime_only``: not those under
    ``if TYPE_CHECKING:`` (annotations only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(inner) for node in ast.walk(tree)
                   if runtime_only and isinstance(node, ast.If)
                   and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
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
