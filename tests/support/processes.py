"""Child processes of a test: ``manage.py soniq_worker`` and other Django programs.

``Processes(tmp_path, settings, env)`` starts children in the project root
with ``DJANGO_SETTINGS_MODULE=settings`` and the given environment, each
with its own output file; ``cleanup()`` kills whatever is still running at
the end of the test. The test decides what the children talk to (which
database URL, which soniq settings): nothing here reads the test's own
connection.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class Child:
    """One child process and its output file."""

    def __init__(self, process: subprocess.Popen, output: Path):
        self.process = process
        self.output = output

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait(self, timeout: float) -> int:
        """The exit status; fail with the end of the output after ``timeout`` seconds."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"process {self.pid} still running after {timeout} s; its "
                                 f"output ends:\n{self.log()[-3000:]}") from None

    def log(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def done_lines(self) -> list[str]:
        """The job ids a worker logged as completed (one log line per job)."""
        return re.findall(r" ([0-9a-f-]{36}) done after ", self.log())


class Processes:
    """Starts children with ``settings`` and ``env``; kills what is left at the end."""

    def __init__(self, tmp_path: Path, settings: str, env: dict[str, str]):
        self.tmp_path, self.settings, self.env = tmp_path, settings, env
        self.children: list[Child] = []

    def start(self, *argv: str, env: dict[str, str] | None = None, **soniq) -> Child:
        """Start ``python *argv`` with ``SONIQ[name] = value`` (as JSON) for each keyword."""
        full = {k: v for k, v in os.environ.items() if not k.startswith("SONIQ_")}
        full.update(self.env, DJANGO_SETTINGS_MODULE=self.settings, PYTHONUNBUFFERED="1")
        full.update({f"SONIQ_{name}": json.dumps(value) for name, value in soniq.items()})
        full.update(env or {})
        output = self.tmp_path / f"child-{len(self.children)}.log"
        with open(output, "wb") as sink:
            process = subprocess.Popen(
                [sys.executable, *argv], cwd=ROOT, env=full, stdin=subprocess.DEVNULL,
                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
            )
        child = Child(process, output)
        self.children.append(child)
        return child

    def worker(self, *args: str, env: dict[str, str] | None = None, **soniq) -> Child:
        """Start ``manage.py soniq_worker *args``."""
        return self.start("manage.py", "soniq_worker", *args, env=env, **soniq)

    def cleanup(self) -> None:
        for child in self.children:
            if child.alive():
                child.process.kill()
        for child in self.children:
            try:
                child.process.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover - a stuck kill
                pass
