"""Child processes of a test: ``manage.py soniq_worker`` and other Django programs.

The one launcher of the suite. ``Processes(folder, settings, env)`` starts
children in the project root with ``DJANGO_SETTINGS_MODULE=settings``, the
given environment and ``SONIQ[name]`` settings passed as ``SONIQ_<name>``
JSON variables, each child with its own output file and session;
``cleanup()`` kills whatever is still running at the end of the test. The
test decides what the children talk to: nothing here reads the test's own
connection (``tests.support.worker_processes`` does, for children on the
test database).
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

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float) -> int:
        """The exit status; fail with the end of the output after ``timeout`` seconds."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"process {self.pid} still running after {timeout} s; its "
                                 f"output ends:\n{self.log()[-3000:]}") from None

    def log(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def count(self, text: str) -> int:
        """How many lines of its output contain ``text``."""
        return sum(text in line for line in self.log().splitlines())

    def done_lines(self) -> list[str]:
        """The job ids a worker logged as completed (one log line per job)."""
        return re.findall(r" ([0-9a-f-]{36}) done after ", self.log())

    def exited(self) -> bool:
        """False while it runs; an AssertionError with its output once it has exited."""
        code = self.process.poll()
        if code is not None:
            raise AssertionError(f"process {self.pid} exited with {code}:\n{self.log()[-3000:]}")
        return False


class Processes:
    """Starts children with ``settings`` and ``env``; kills what is left at the end."""

    def __init__(self, folder: Path, settings: str, env: dict[str, str] | None = None, *,
                 inherit_soniq_env: bool = False):
        self.folder, self.settings, self.env = folder, settings, dict(env or {})
        self.inherit_soniq_env = inherit_soniq_env
        self.children: list[Child] = []

    def start(self, *argv: str, env: dict[str, str] | None = None, **soniq) -> Child:
        """Start ``python *argv`` (see ``python()``)."""
        return self.python(*argv, env=env, **soniq)

    def python(self, *argv: str, env: dict[str, str] | None = None, **soniq) -> Child:
        """Start ``python *argv`` with ``SONIQ[name] = value`` (as JSON) for each keyword.

        The parent's own ``SONIQ_*`` variables are passed on only with
        ``inherit_soniq_env`` (the run log a fixture set, say); otherwise a
        child gets exactly the soniq settings its test names.
        """
        full = {k: v for k, v in os.environ.items()
                if self.inherit_soniq_env or not k.startswith("SONIQ_")}
        full.update(self.env, DJANGO_SETTINGS_MODULE=self.settings, PYTHONUNBUFFERED="1")
        full.update({f"SONIQ_{name}": json.dumps(value) for name, value in soniq.items()})
        full.update(env or {})
        output = self.folder / f"child-{len(self.children)}.log"
        with open(output, "wb") as sink:
            process = subprocess.Popen(
                [sys.executable, *argv], cwd=ROOT, env=full, stdin=subprocess.DEVNULL,
                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
            )
        child = Child(process, output)
        self.children.append(child)
        return child

    def manage(self, *args: str, env: dict[str, str] | None = None, **soniq) -> Child:
        """Start ``manage.py *args``."""
        return self.python("manage.py", *args, env=env, **soniq)

    def worker(self, *args: str, env: dict[str, str] | None = None, **soniq) -> Child:
        """Start ``manage.py soniq_worker *args``."""
        return self.manage("soniq_worker", *args, env=env, **soniq)

    def cleanup(self) -> None:
        kill_all(self.children)


def kill_all(children: "list[Child]") -> None:
    """Kill every child still running, then reap each (10 s at most apiece)."""
    for child in children:
        if child.alive:
            child.process.kill()
    for child in children:
        try:
            child.process.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a stuck kill
            pass
