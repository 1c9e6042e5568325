import logging
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from soniq_django.management.console import command_log
from soniq_django.management.database import (
    add_database_argument, database_alias, require_migrated,
)
from soniq_django.scheduler import Scheduler
from soniq_django.worker.connection import own_connection

logger = logging.getLogger("soniq_django.scheduler")


class Command(BaseCommand):
    help = (
        "Enqueue the jobs of soniq_recurring_jobs (and of @periodic code schedules) as they "
        "fall due. Any number may run at once: each tick is enqueued exactly once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_database_argument(parser)
        parser.add_argument(
            "--once", action="store_true", help="Write code schedules, run one tick and exit."
        )
        parser.add_argument(
            "--interval", type=float, default=1.0,
            help="Seconds between ticks (default: %(default)s).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["interval"] > 0:
            raise CommandError("--interval must be a positive number of seconds")
        alias = database_alias(options)
        require_migrated(alias)
        # Its own log on stderr unless the project configured the soniq_django loggers.
        with command_log(self, options["verbosity"]):
            scheduler = Scheduler(using=alias)
            if options["once"]:
                scheduler.sync_code_schedules()
                job_ids = scheduler.run_due()
                self.stdout.write(f"{len(job_ids)} job(s) enqueued")
                return
            stop = threading.Event()
            own_connection(alias)  # the worker's TCP options: a partition is noticed in time
            with _stop_on_signals(stop):
                scheduler.run_forever(stop, interval=options["interval"])


class _stop_on_signals:
    """SIGTERM and SIGINT set ``stop`` (the scheduler then exits 0) while this block runs."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, stop: threading.Event):
        self.stop = stop
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> "_stop_on_signals":
        # Handlers can only be installed from the main thread (call_command
        # may run elsewhere, e.g. in tests); there, signals keep their default.
        if threading.current_thread() is threading.main_thread():
            for number in self.SIGNALS:
                self.previous[number] = signal.signal(number, self.received)
        return self

    def received(self, signum: int, frame: object) -> None:
        logger.info("%s received: stopping after the current tick", signal.Signals(signum).name)
        self.stop.set()

    def __exit__(self, *exc_info: object) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)
