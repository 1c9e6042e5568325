import logging
import os
import signal
import sys
import threading
import uuid
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from soniq_django import flow
from soniq_django.conf import get_settings
from soniq_django.errors import ConfigValidationError
from soniq_django.management.console import command_log
from soniq_django.management.database import (
    add_database_argument, database_alias, require_migrated,
)
from soniq_django.owned.types import queue_names
from soniq_django.registry import discover
from soniq_django.worker import Worker
from soniq_django.worker.connection import wait_for_database

logger = logging.getLogger("soniq_django.worker")


def _require_handlers() -> None:
    """Refuse to start while a module of SONIQ["IMPORTS"] cannot be imported.

    Its handlers' jobs would reach a worker that does not know them (they are
    deferred, then dead-lettered as job_not_found); soniq.E009 says the same.
    """
    failed = discover()
    if failed:
        raise CommandError("SONIQ['IMPORTS'] names modules that cannot be imported: " + ", ".join(
            f"{name} ({error})" for name, error in failed))


def _require_queue_settings() -> None:
    """Refuse to start on a SONIQ["QUEUES"] it cannot apply (soniq.E011 says the same)."""
    found = flow.problems(get_settings().QUEUES)
    if found:
        raise CommandError("SONIQ['QUEUES'] is invalid (soniq.E011): " + " ".join(found))


def _queues(value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise CommandError("--queues needs at least one queue name")
    try:
        return queue_names(names)
    except ConfigValidationError:  # bytes that are not UTF-8 on the command line
        raise CommandError("--queues: a queue name is not valid UTF-8 text") from None


class Command(BaseCommand):
    help = (
        "Run jobs. Claims jobs with fenced, leased claims, runs their handlers and records "
        "the outcome. SIGTERM or Ctrl-C: stop claiming, finish running jobs, exit 0; at the "
        "end of --grace, running jobs are asked to stop (those that stop are given back "
        "at once) and the worker exits within seconds, abandoning the others (status 1); "
        "a second signal exits at once (the abandoned jobs are re-run after their lease). "
        "Without a LOGGING setting for soniq_django it logs to stderr: -v 0 warnings and "
        "errors, -v 1 a line per job, -v 2 claims, heartbeats and wake-ups too."
    )

    #: The worker of this command's run (``_run``): whether it abandoned a running handler.
    _worker: Worker | None = None

    def run_from_argv(self, argv: list[str]) -> None:
        """``manage.py soniq_worker``: as any command; then, if the worker stopped while a
        handler still ran (abandoned at the end of its grace), end the process at once.

        A plain function cannot be interrupted: its thread (a daemon thread) and any
        thread it started itself (an executor's, which the interpreter joins at exit)
        would keep the process alive until it returned -- under systemd or ``docker
        stop``, until a SIGKILL. The logs are flushed first; the worker's row was marked
        stopped, within its bound (decision 0032).
        """
        try:
            super().run_from_argv(argv)
        except SystemExit as exit:
            self._exit_if_abandoned(exit.code)
            raise
        self._exit_if_abandoned(0)

    def _exit_if_abandoned(self, code: object) -> None:
        worker = self._worker
        if worker is None or not worker.abandoned:
            return
        logging.shutdown()  # flush every log handler: os._exit skips it
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed, or a pipe nobody reads
                pass
        os._exit(code if isinstance(code, int) else 1)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queues", help="Comma-separated queues to serve (default: all).")
        parser.add_argument("--concurrency", type=int, default=1,
                            help="Jobs run at once, in threads (default: 1).")
        parser.add_argument("--burst", action="store_true",
                            help="Exit once no job is due and none is running; jobs waiting "
                                 "for a later time (a retry's backoff, a run_at) and those of "
                                 "paused queues stay queued. The last log line counts them, "
                                 "and the jobs other workers still hold.")
        parser.add_argument("--wait-for-leases", action="store_true",
                            help="With --burst: do not exit while other workers' leases hold "
                                 "jobs of these queues (a dead worker's jobs come back when "
                                 "its leases lapse, and are run).")
        parser.add_argument("--max-jobs", type=int, help="Exit after claiming this many jobs.")
        parser.add_argument("--worker-id", help="This worker's id (default: a new UUID).")
        parser.add_argument("--with-scheduler", action="store_true",
                            help="Also run the scheduler of periodic jobs in this process.")
        parser.add_argument("--grace", type=float, default=30.0,
                            help="Seconds running jobs get to finish after a stop signal; "
                                 "then they are asked to stop, and abandoned 2 s later.")
        parser.add_argument("--metrics-port", type=int,
                            help="Serve Prometheus metrics over HTTP on this port (0: a free "
                                 "one, logged); needs the prometheus extra (docs/metrics.md).")
        parser.add_argument("--metrics-addr", default="0.0.0.0",
                            help="With --metrics-port: the address to listen on "
                                 "(default 0.0.0.0).")
        parser.add_argument("--metrics-queues", action="store_true",
                            help="With --metrics-port: serve the queue-level series too (one "
                                 "query per scrape, on a connection of its own).")
        parser.add_argument("--metrics-textfile",
                            help="Write Prometheus metrics to this file (a .prom file for "
                                 "node_exporter's textfile collector) at every heartbeat.")
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        if options["max_jobs"] is not None and options["max_jobs"] < 1:
            raise CommandError("--max-jobs must be at least 1")
        if options["wait_for_leases"] and not options["burst"]:
            raise CommandError("--wait-for-leases needs --burst")
        _check_metrics_options(options)
        if options["worker_id"] is not None:
            try:
                uuid.UUID(options["worker_id"])
            except ValueError:
                raise CommandError("--worker-id must be a UUID") from None
        # The worker's own log on stderr while it runs, unless the project
        # configured the soniq_django loggers (console.py says when).
        with command_log(self, options["verbosity"]):
            code = self._run(options)
        if code:
            raise SystemExit(code)

    def _run(self, options: Any) -> int:
        using = database_alias(options)  # the routers' write alias for jobs, by default
        wait_for_database(using)  # a refusing server is waited for, never fatal
        require_migrated(using)
        _require_handlers()
        _require_queue_settings()
        worker = Worker(
            using=using, queues=_queues(options["queues"]),
            concurrency=options["concurrency"], burst=options["burst"],
            max_jobs=options["max_jobs"], worker_id=options["worker_id"],
            with_scheduler=options["with_scheduler"], grace_seconds=options["grace"],
            wait_for_leases=options["wait_for_leases"],
        )
        self._worker = worker
        with ExitStack() as stack:
            try:
                stack.enter_context(_metrics(worker, options))
            except OSError as error:  # the port is taken, the address is not this host's
                raise CommandError(f"--metrics-port {options['metrics_port']}: cannot listen on "
                                   f"{options['metrics_addr']} ({error.strerror})") from None
            stack.enter_context(_Signals(worker))
            return worker.run()


def _check_metrics_options(options: Any) -> None:
    port = options["metrics_port"]
    if port is not None and not 0 <= port <= 65535:
        raise CommandError("--metrics-port must be from 0 to 65535")
    if port is None and (options["metrics_queues"] or options["metrics_addr"] != "0.0.0.0"):
        raise CommandError("--metrics-addr and --metrics-queues need --metrics-port")


def _metrics(worker: Worker, options: Any) -> AbstractContextManager[None]:
    """The worker's metrics exposition the options ask for (none: a block that does nothing)."""
    if options["metrics_port"] is None and options["metrics_textfile"] is None:
        return nullcontext()
    try:
        from soniq_django.metrics import exposed
    except ImportError as error:  # ExtraNotInstalled: it names the pip install
        raise CommandError(str(error)) from None
    return exposed(worker, port=options["metrics_port"], addr=options["metrics_addr"],
                   textfile=options["metrics_textfile"], queues=options["metrics_queues"])


class _Signals:
    """While the worker runs: the first SIGTERM or SIGINT stops it gently, a second at once.

    Each signal is logged when it arrives. The previous handlers come back
    afterwards. Handlers can only be installed from the main thread
    (``call_command`` may run elsewhere, e.g. in tests); there, signals keep
    theirs.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, worker: Worker):
        self.worker = worker
        self.count = 0
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> "_Signals":
        if threading.current_thread() is threading.main_thread():
            for number in self.SIGNALS:
                self.previous[number] = signal.signal(number, self.received)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)

    def received(self, signum: int, frame: object) -> None:
        self.count += 1
        name = signal.Signals(signum).name
        running = len(self.worker.flights)
        if self.count == 1:
            if running:
                logger.info("%s received: no more claims; finishing %d running job(s), up to "
                            "%g s (signal again to exit at once)", name, running,
                            self.worker.grace_seconds)
            else:
                logger.info("%s received: no job running; stopping", name)
            self.worker.request_stop()
            return
        logger.warning("%s received again: exiting at once; %d running job(s) abandoned (they "
                       "run again once their leases lapse)", name, running)
        self.worker.abort()
        os._exit(1)  # job threads cannot be interrupted; their leases will lapse
