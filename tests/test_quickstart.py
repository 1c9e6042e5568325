"""docs/quickstart.md, followed as written: a fresh project built from the page's own text.

The page's code blocks are the script. A ``sh`` block is run line by line
in the new project's directory (``python`` is this interpreter,
``django-admin`` is ``python -m django``); a ``python`` block whose first
line is ``# <path>`` is that file, written whole, or appended to it when
the line says "(add at the end)". Three commands a person types
differently from a script are adapted, and only they: the install block is
checked, not run (this pass's interpreter already has this checkout and the
pass's Django: 5.2 or 6.0); ``createsuperuser`` gets its answers from
``--noinput`` and the environment; ``runserver`` gets a free port and no
autoreloader, and the test logs in through the login form and opens the
dashboard the page links to. The project is SQLite, as the page's is, on
both database passes.
"""

import http.cookiejar
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "quickstart.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```\n", re.S | re.M)
PASSWORD = "a-long-quickstart-password-0"

#: The install block, exactly: a checkout beside the project, installed into a fresh venv.
INSTALL = ["python -m venv .venv", ". .venv/bin/activate", "pip install ../soniq_django"]


def blocks() -> list[tuple[str, str]]:
    return [(kind, body) for kind, body in BLOCK.findall(PAGE.read_text(encoding="utf-8"))]


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DJANGO_", "SONIQ_", "DATABASE_URL"))}
    return {**env, "PYTHONPATH": str(ROOT), "DJANGO_SUPERUSER_PASSWORD": PASSWORD}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Project:
    """The new project's directory, and what its commands printed."""

    def __init__(self, path: Path):
        self.path = path
        self.env = environment()
        self.outputs: dict[str, subprocess.CompletedProcess[str]] = {}
        self.dashboard_page = ""

    def write(self, body: str) -> None:
        first, _, _ = body.partition("\n")
        match = re.fullmatch(r"# (\S+)( \(add at the end\))?", first)
        assert match, f"a python block starts with '# <path>': {first!r}"
        target = self.path / match.group(1)
        if match.group(2):
            assert target.exists(), f"{target} is added to, so an earlier step made it"
            target.write_text(target.read_text(encoding="utf-8") + "\n" + body,
                              encoding="utf-8")
        else:
            target.write_text(body, encoding="utf-8")

    def run(self, line: str) -> None:
        words = shlex.split(line)
        if words[0] == "django-admin":
            argv = [sys.executable, "-m", "django", *words[1:]]
        else:
            assert words[0] == "python", f"a command of the page is python or django-admin: {line}"
            argv = [sys.executable, *words[1:]]
        if words[1:3] == ["manage.py", "runserver"]:
            self.visit_the_dashboard(argv)
            return
        if words[1:3] == ["manage.py", "createsuperuser"]:
            argv += ["--noinput", "--username", "admin", "--email", "admin@example.com"]
        done = subprocess.run(argv, cwd=self.path, env=self.env, capture_output=True,
                              text=True, timeout=180)
        assert done.returncode == 0, f"{line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        self.outputs[line] = done

    def visit_the_dashboard(self, argv: list[str]) -> None:
        port = free_port()
        server = subprocess.Popen([*argv, f"127.0.0.1:{port}", "--noreload"], cwd=self.path,
                                  env=self.env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}"
            jar = http.cookiejar.CookieJar()
            browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
            deadline = time.monotonic() + 60
            while True:
                try:
                    login = browser.open(f"{base}/admin/login/", timeout=10).read().decode()
                    break
                except OSError:
                    assert server.poll() is None, "runserver exited"
                    assert time.monotonic() < deadline, "runserver never answered"
                    time.sleep(0.3)
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login).group(1)
            dashboard = re.search(r"<http://127\.0\.0\.1:8000(/admin/soniq_django/dashboard/)>",
                                  PAGE.read_text(encoding="utf-8")).group(1)
            form = urllib.parse.urlencode({
                "csrfmiddlewaretoken": token, "username": "admin", "password": PASSWORD,
                "next": dashboard}).encode()
            request = urllib.request.Request(f"{base}/admin/login/?next={dashboard}", data=form,
                                             headers={"Referer": f"{base}/admin/login/"})
            response = browser.open(request, timeout=30)
            assert response.status == 200 and response.url == f"{base}{dashboard}"
            self.dashboard_page = response.read().decode()
        finally:
            server.terminate()
            server.wait(30)


def test_the_quickstart_page_builds_a_project_that_runs_tests_and_shows_its_job(tmp_path):
    project = Project(tmp_path / "project")
    project.path.mkdir()
    steps = blocks()
    kinds = [kind for kind, _ in steps]
    assert kinds.count("sh") >= 5 and kinds.count("python") == 4, kinds

    install = [body for kind, body in steps if kind == "sh"][0]
    assert install.splitlines() == INSTALL
    assert "pip install soniq-django\n" not in PAGE.read_text(encoding="utf-8")
    for kind, body in steps:
        if kind == "python":
            project.write(body)
        elif kind == "sh" and body != install:
            for line in body.splitlines():
                project.run(line)

    check = project.outputs["python manage.py check"]
    assert check.stdout.strip() == "System check identified no issues (0 silenced).", (
        check.stdout + check.stderr)
    enqueued = next(out for line, out in project.outputs.items() if "greet.enqueue" in line)
    job_id = enqueued.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"[0-9a-f-]{36}", job_id), enqueued.stdout
    worker = project.outputs["python manage.py soniq_worker --burst"]
    assert re.search(rf"INFO +shop\.greet {job_id} done after \d+\.\d{{3}}s \(attempt 1\)",
                     worker.stderr), worker.stderr
    assert "stopped after 1 jobs (1 done)" in worker.stderr
    tests = project.outputs["python manage.py test shop"]
    assert "Ran 1 test" in tests.stderr and "OK" in tests.stderr, tests.stderr
    # The dashboard shows the queue the job ran on, with the job done.
    assert "Dashboard" in project.dashboard_page
    assert "default" in project.dashboard_page
