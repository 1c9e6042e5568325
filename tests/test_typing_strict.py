"""``mypy --strict`` passes on the package, with the configuration in pyproject.toml.

The package ships ``py.typed``, so a project's type checker reads these
annotations; this keeps them complete and true. Django has no type
information here (django-stubs is not used), so pyproject.toml relaxes what
follows from that and nothing more: a second test holds the list. Without
mypy (a test extra) the first test skips on a developer machine and fails
under CI=true.
"""

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.support.ci import unavailable

ROOT = Path(__file__).resolve().parents[1]

#: The per-module relaxations pyproject.toml may make, and each one's settings.
RELAXATIONS = {
    ("django.*", "croniter.*", "django_tasks.*"): {"ignore_missing_imports": True},
    ("soniq_django.migrations.*",): {
        "disallow_untyped_defs": False, "disable_error_code": ["var-annotated", "attr-defined"]},
    ("soniq_django.admin.*",): {"disallow_untyped_decorators": False, "warn_return_any": False},
}


def test_mypy_strict_passes_on_the_package(tmp_path):
    if importlib.util.find_spec("mypy") is None:
        unavailable("mypy is not installed (pip install mypy)")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "cache"), "--no-error-summary"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), done.stdout + done.stderr


def test_the_configuration_is_strict_with_only_the_listed_relaxations():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert config["strict"] is True and config["files"] == ["soniq_django"]
    # Django's classes are Any without stubs: models, admins, commands subclass them.
    assert {key: value for key, value in config.items() if key != "overrides"} == {
        "python_version": "3.11", "files": ["soniq_django"], "strict": True,
        "disallow_subclassing_any": False}
    found = {tuple(entry["module"]): {k: v for k, v in entry.items() if k != "module"}
             for entry in config["overrides"]}
    assert found == RELAXATIONS
