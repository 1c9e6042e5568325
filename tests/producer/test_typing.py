"""``@job`` keeps its function's signature for type checkers: mypy checks ``.enqueue`` kwargs.

Runs mypy (a test dependency) on a small snippet against this checkout's
``soniq_django`` (py.typed): a right call type-checks, a wrong keyword or
type is an error naming the method. Without mypy the test skips on a
developer machine and fails under CI=true.
"""

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.ci import unavailable

ROOT = Path(__file__).resolve().parents[2]

SNIPPET = '''
from soniq_django import abulk_enqueue, aenqueue, aget_job, enqueue, job, periodic


@job(name="typing.send")
def send(order_id: int, note: str = "") -> dict:
    return {}


@job
def bare(x: int) -> int:
    return x


@job()
def called(x: int) -> int:
    return x


@periodic(every=60)
@job(name="typing.tick")
def tick(region: str = "eu") -> None:
    pass


@job(name="typing.atomic", queue="q", retries=1, unique=False, atomic=True)
def confirm(order_id: int) -> None:
    return None


async def in_a_view() -> None:
    await send.aenqueue(order_id=1)
    await aenqueue("typing.send", {"order_id": 1})
    await abulk_enqueue([])
    await aget_job("0b4c5f29-3bd5-4e1e-9d35-6d5bd7b0c3ad")
    await send.aenqueue(oops=1)  # E:aenqueue


number: int = bare(1) + called(2)
send.enqueue(order_id=1)
send.enqueue(2, note="x")
send.enqueue_on_commit(order_id=3)
send.configure(priority=1).enqueue(order_id=4)
enqueue("typing.send", {"order_id": 5})
send.enqueue(order=1)  # E:enqueue
bare.enqueue(x="no")  # E:enqueue
send.configure(priority=1).enqueue(order_id="no")  # E:enqueue
send.enqueue_on_commit()  # E:enqueue_on_commit
confirm.enqueue(order_id=6)
confirm.enqueue(order_id="no")  # E:enqueue
wrong: str = bare(1)  # E:assignment
tick.enqueue(region="us")
tick.enqueue(zone="us")  # E:enqueue
'''


def _mypy(tmp_path: Path) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("mypy") is None:
        unavailable("mypy is not installed (pip install mypy)")
    source = tmp_path / "snippet.py"
    source.write_text(textwrap.dedent(SNIPPET), encoding="utf-8")
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n", encoding="utf-8")
    # This checkout first (MYPYPATH and cwd), not an installed soniq_django;
    # errors inside the package and in untyped Django are not this test's,
    # and neither is the package's own strict configuration (pyproject.toml,
    # tests/test_typing_strict.py): a config file of mypy's defaults.
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config),
         "--follow-imports=silent", "--ignore-missing-imports",
         "--no-incremental", "--cache-dir", os.devnull, "--python-version", "3.11",
         "--show-error-codes", "--no-error-summary", str(source)],
        cwd=ROOT, env={**os.environ, "MYPYPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=300,
    )


def _expected() -> dict[int, str]:
    lines = textwrap.dedent(SNIPPET).splitlines()
    return {number: line.split("# E:")[1] for number, line in enumerate(lines, 1)
            if "# E:" in line}


def test_mypy_checks_the_handlers_arguments(tmp_path):
    result = _mypy(tmp_path)
    errors: dict[int, list[str]] = {}
    for line in result.stdout.splitlines():
        match = re.match(r".*snippet\.py:(\d+): error: (.*)", line)
        if match:
            errors.setdefault(int(match[1]), []).append(match[2])
    assert result.returncode in (0, 1) and not result.stderr.strip(), result.stderr
    expected = _expected()
    assert sorted(errors) == sorted(expected), result.stdout
    for number, what in expected.items():
        text = " ".join(errors[number])
        assert (f'"{what}" of "' in text) if what != "assignment" else "[assignment]" in text, text
