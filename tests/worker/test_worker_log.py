"""What ``manage.py soniq_worker`` prints when the project configured no logging, and when it did.

Real processes (``tests.worker_settings``; ``SONIQ_TEST_LOGGING={}`` is a
project with no ``LOGGING``, as a fresh ``startproject`` is), their stdout
and stderr kept apart. Then the command in this process: its handler is
taken off after each call, and what counts as configured.
"""

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from soniq_django import enqueue
from soniq_django.management import console
from soniq_django.models import DeadLetterJob, Job, RecurringJob
from tests.support.worker_processes import database_url
from tests.support.workers import RunLog, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
NO_LOGGING = {}  # Django's default: it configures the "django" loggers only
ROOT_HANDLER = {  # a project that sends everything to the root logger's handler
    "version": 1, "disable_existing_loggers": False,
    "formatters": {"bare": {"format": "%(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "bare"}},
    "root": {"handlers": ["stderr"], "level": "INFO"},
}
A_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO|WARNING|ERROR) +\S")
SECRET_ARG = 987654321  # a job argument no line may show


class Process:
    """``manage.py soniq_worker *args`` with its own stdout and stderr files."""

    def __init__(self, folder: Path, *args: str, logging_config, **soniq):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SONIQ_")}
        env.update({"DJANGO_SETTINGS_MODULE": "tests.worker_settings",
                    "SONIQ_WORKER_DATABASE_URL": database_url(connection),
                    "PYTHONUNBUFFERED": "1"})
        if logging_config is not None:  # None: tests.worker_settings' own LOGGING
            env["SONIQ_TEST_LOGGING"] = json.dumps(logging_config)
        env.update({f"SONIQ_{name}": json.dumps(value) for name, value in soniq.items()})
        # The handlers' own record of each run: a job's status turns to
        # processing at its claim, a moment before the worker runs it.
        env["SONIQ_TEST_RUN_LOG"] = str(folder / "runs.log")
        self.run_log = RunLog(folder / "runs.log")
        self.out, self.err = folder / "stdout.log", folder / "stderr.log"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "soniq_worker", *args], cwd=ROOT, env=env,
                stdin=subprocess.DEVNULL, stdout=out, stderr=err)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker still running after {timeout} s; stderr ends:\n"
                                 f"{self.stderr()[-3000:]}") from None

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def lines(self, text: str) -> list[str]:
        return [line for line in self.stderr().splitlines() if text in line]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def worker(tmp_path):
    started = []

    def start(*args: str, logging_config=NO_LOGGING, **soniq) -> Process:
        folder = tmp_path / f"worker-{len(started)}"
        folder.mkdir()
        started.append(Process(folder, *args, logging_config=logging_config, **soniq))
        return started[-1]

    yield start
    for process in started:
        process.kill()


def three_jobs():
    """One that succeeds, one that fails (and is retried), one dead-lettered at once."""
    return (enqueue("tests.worker.ok", {"n": SECRET_ARG}),
            enqueue("tests.worker.always_fails", {"message": "boom"}),
            enqueue("tests.worker.permanent"))


# Real processes ----------------------------------------------------------------


def test_with_no_logging_configured_the_worker_logs_to_stderr(worker, backend):
    ok, failing, permanent = three_jobs()
    run = worker("--burst", RETRY_BASE_SECONDS=40, POLL_INTERVAL=0.2)
    assert run.wait() == 0, run.stderr()
    text = run.stderr()
    assert run.stdout() == ""
    assert all(A_LINE.match(line) for line in text.splitlines()), text

    (banner,) = run.lines(" started on database ")
    vendor = "postgresql" if backend == "postgresql" else "sqlite"
    assert re.search(rf"INFO +worker [0-9a-f]{{8}} started on database 'default' \({vendor}"
                     r"(, through a pooler)?\): queues all, concurrency 1, \d+ handler\(s\); "
                     r"wake-ups: ", banner), banner
    wake = ("LISTEN on 'default' (tested at start) and polling every 0.2 s"
            if backend == "postgresql" else "polling every 0.2 s")
    assert banner.endswith(f"wake-ups: {wake}; burst: exits when no job is due (it leaves "
                           "jobs waiting for a later time and those of paused queues)"), banner

    (done,) = run.lines(f"tests.worker.ok {ok} done after ")
    assert re.search(r"INFO +tests\.worker\.ok \S+ done after \d+\.\d{3}s \(attempt 1\)$", done)

    # The retry line says the delay the job really waits, not how long it ran.
    row = Job.objects.get(id=failing)
    (retry,) = run.lines(f"tests.worker.always_fails {failing} failed after ")
    found = re.search(rf"WARNING +\S+ \S+ failed after (\d+\.\d+)s \(attempt 1 of "
                      rf"{row.max_attempts}\), will retry in (\d+\.\d)s: ValueError: boom$", retry)
    assert found, retry
    ran, delay = float(found.group(1)), float(found.group(2))
    assert ran < 5 and 20 <= delay <= 40  # RETRY_BASE_SECONDS=40, jitter 0.5 to 1
    assert abs((row.scheduled_at - row.updated_at).total_seconds() - delay) <= 0.051

    (dead,) = run.lines(f"tests.worker.permanent {permanent} ")
    assert re.search(r"ERROR +\S+ \S+ dead-lettered \(permanent_failure\) after \d+\.\d{3}s "
                     r"\(attempt 1\): PermanentFailure: retrying cannot help$", dead), dead
    assert DeadLetterJob.objects.filter(id=permanent).exists()

    last = text.splitlines()[-1]
    assert re.search(r"INFO +worker [0-9a-f]{8} stopped after 3 jobs \(1 done, 1 to retry, "
                     r"1 dead-lettered\); other workers still hold 0 job\(s\)", last), last

    # Never a job's args, a claim token or the connection string.
    tokens = [t for t in Job.objects.values_list("claim_token", flat=True) if t]
    assert tokens and not any(token in text for token in tokens)
    assert str(SECRET_ARG) not in text
    assert database_url(connection) not in text
    if connection.settings_dict["PASSWORD"]:
        assert connection.settings_dict["PASSWORD"] not in text


def test_the_last_retry_says_the_job_is_dead_lettered(worker):
    failing = enqueue("tests.worker.always_fails", {"message": "boom"}, max_attempts=1)
    run = worker("--burst")
    assert run.wait() == 0, run.stderr()
    (line,) = run.lines(str(failing))
    assert re.search(r"ERROR +\S+ \S+ failed after \d+\.\d{3}s \(attempt 1 of 1\) and has no "
                     r"attempts left: dead-lettered \(max_retries_exceeded\): ValueError: boom$",
                     line), line


@pytest.mark.parametrize("verbosity", ["0", "2"])
def test_verbosity_sets_the_level(worker, verbosity):
    ok, failing, permanent = three_jobs()
    run = worker("--burst", "-v", verbosity, RETRY_BASE_SECONDS=40)
    assert run.wait() == 0, run.stderr()
    levels = {A_LINE.match(line).group(1) for line in run.stderr().splitlines()}
    claimed = run.lines(f"claimed tests.worker.ok {ok} (attempt 1)")
    if verbosity == "0":  # warnings and errors only: no banner, no line per finished job
        assert levels == {"WARNING", "ERROR"}, run.stderr()
        assert not run.lines(" started on database ") and not run.lines(" done after ")
        assert not claimed
    else:  # DEBUG: claims too
        assert levels == {"DEBUG", "INFO", "WARNING", "ERROR"}, run.stderr()
        assert len(claimed) == 1 and "DEBUG" in claimed[0]
    assert len(run.lines(f"{failing} failed after ")) == 1
    assert len(run.lines(f"{permanent} dead-lettered (permanent_failure)")) == 1


@pytest.mark.parametrize("config", [None, ROOT_HANDLER], ids=["soniq_django-handler", "root"])
def test_a_project_logging_config_is_used_as_it_is_and_nothing_is_doubled(worker, config):
    ok = enqueue("tests.worker.ok")
    run = worker("--burst", "-v", "2", logging_config=config)  # -v 2 must not change it
    assert run.wait() == 0, run.stderr()
    assert len(run.lines(" started on database ")) == 1
    assert len(run.lines(f"{ok} done after ")) == 1
    assert len(run.lines(" stopped after 1 jobs (1 done)")) == 1
    assert not run.lines("claimed ")  # their level (INFO) stands: no DEBUG lines
    assert not any(A_LINE.match(line) for line in run.stderr().splitlines())  # their format


def test_a_stop_signal_is_logged_as_it_arrives(worker):
    sleeper = enqueue("tests.worker.sleep", {"seconds": 1.5})
    run = worker("--grace", "20")
    wait_until(lambda: run.run_log.events("start", sleeper) or run.process.poll() is not None,
               30, "the job to start")
    run.process.send_signal(signal.SIGTERM)
    assert run.wait() == 0, run.stderr()
    (line,) = run.lines("SIGTERM received")
    assert line.endswith("INFO    SIGTERM received: no more claims; finishing 1 running job(s), "
                         "up to 20 s (signal again to exit at once)"), line
    lines = run.stderr().splitlines()
    (done,) = [i for i, text in enumerate(lines) if f"{sleeper} done after " in text]
    assert lines.index(line) < done  # said at once, not at exit
    assert lines[-1].endswith("stopped after 1 jobs (1 done)")


def test_a_second_signal_is_logged_before_the_worker_exits_at_once(worker):
    sleeper = enqueue("tests.worker.sleep", {"seconds": 30})
    run = worker()
    wait_until(lambda: run.run_log.events("start", sleeper) or run.process.poll() is not None,
               30, "the job to start")
    run.process.send_signal(signal.SIGINT)  # Ctrl-C
    wait_until(lambda: run.lines("SIGINT received"), 10, "the first signal's line")
    run.process.send_signal(signal.SIGTERM)
    assert run.wait() == 1
    (line,) = run.lines("SIGTERM received again")
    assert line.endswith("WARNING SIGTERM received again: exiting at once; 1 running job(s) "
                         "abandoned (they run again once their leases lapse)"), line


# The command in this process -----------------------------------------------------


@contextmanager
def unconfigured():
    """This process as a project without LOGGING, for the block: no handler on the root logger.

    pytest's log capture puts its handlers there (with them, logging counts as
    configured); they are back before pytest takes them off.
    """
    root = logging.getLogger()
    saved, root.handlers = root.handlers, []
    try:
        soniq = logging.getLogger("soniq_django")
        assert not soniq.handlers and soniq.level == logging.NOTSET
        yield
    finally:
        root.handlers = saved


@contextmanager
def handler_on(name: str):
    """A handler on logger ``name`` ("" is the root) for the block."""
    handler = logging.NullHandler()
    logging.getLogger(name).addHandler(handler)
    try:
        yield
    finally:
        logging.getLogger(name).removeHandler(handler)


@contextmanager
def not_propagating(name: str):
    target = logging.getLogger(name)
    target.propagate = False
    try:
        yield
    finally:
        target.propagate = True


def test_the_command_takes_its_handler_off_after_each_call():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    soniq = logging.getLogger("soniq_django")
    outputs = []
    with unconfigured():
        for verbosity in (1, 1, 0):
            stderr = io.StringIO()
            call_command("soniq_worker", "--burst", verbosity=verbosity, stderr=stderr)
            outputs.append(stderr.getvalue())
            assert not soniq.handlers and soniq.level == logging.NOTSET
        with pytest.raises(CommandError):  # an error inside the command takes it off too
            call_command("soniq_worker", "--queues", " , ", stderr=io.StringIO())
        assert not soniq.handlers and soniq.level == logging.NOTSET
    assert [text.count(" started on database ") for text in outputs] == [1, 1, 0]
    assert [text.count(" stopped after 0 jobs") for text in outputs] == [1, 1, 0]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_under_a_configured_logging_the_command_adds_nothing(caplog):
    stderr = io.StringIO()  # pytest's capture is on the root logger: that is a configuration
    with caplog.at_level(logging.DEBUG, logger="soniq_django"):
        call_command("soniq_worker", "--burst", verbosity=0, stderr=stderr)
    assert stderr.getvalue() == ""
    banners = [r for r in caplog.records if " started on database " in r.getMessage()]
    assert len(banners) == 1  # -v 0 did not change the level the configuration chose
    assert logging.getLogger("soniq_django").handlers == []


def test_what_counts_as_configured():
    with unconfigured():
        assert not console.configured()
        with handler_on("django"):  # Django's defaults configure the "django" loggers only
            assert not console.configured()
        for name in ("", "soniq_django", "soniq_django.worker"):
            with handler_on(name):
                assert console.configured(), name
        # A handler above a logger that does not propagate never sees its records.
        with handler_on(""), not_propagating("soniq_django"):
            assert not console.configured()


def test_the_scheduler_command_speaks_the_same_way():
    RecurringJob.objects.create(job_name="tests.worker.ok", schedule_type="interval",
                                schedule_value="60")
    soniq = logging.getLogger("soniq_django")
    stdout, stderr = io.StringIO(), io.StringIO()
    with unconfigured():
        call_command("soniq_scheduler", "--once", stdout=stdout, stderr=stderr)
        assert not soniq.handlers and soniq.level == logging.NOTSET
    assert stdout.getvalue() == "1 job(s) enqueued\n"
    (line,) = stderr.getvalue().splitlines()
    assert A_LINE.match(line) and " INFO    enqueued tests.worker.ok for " in line, line
