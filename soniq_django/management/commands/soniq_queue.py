import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils.connection import ConnectionDoesNotExist

from soniq_django import flow
from soniq_django.errors import SoniqError
from soniq_django.management.database import add_database_argument, database_alias


def _rate(rate: tuple[int, int] | None) -> str:
    if rate is None:
        return "-"
    count, period = rate
    unit = {seconds: unit for unit, seconds in flow.RATE_UNITS.items()}.get(period)
    return f"{count}/{unit}" if unit else f"{count}/{period}s"


class Command(BaseCommand):
    help = (
        "Flow control per queue: pause or resume a queue on every worker, show each queue's "
        "limits and jobs, or write SONIQ['QUEUES'] to the database (soniq_worker does that "
        "when it starts)."
    )

    def add_arguments(self, parser: Any) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        pause = actions.add_parser("pause", help="Stop every worker from claiming the queue's "
                                                 "jobs; running jobs finish.")
        pause.add_argument("queue")
        pause.add_argument("--by", help="Who pauses it, for people to read (default: the OS "
                                        "user).")
        resume = actions.add_parser("resume", help="Let workers claim the queue's jobs again.")
        resume.add_argument("queue")
        actions.add_parser("status", help="Each queue's pause, limits and jobs now.")
        actions.add_parser("sync", help="Write SONIQ['QUEUES'] into soniq_queue_settings.")
        for sub in actions.choices.values():
            add_database_argument(sub)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            using = database_alias(options)
            action = options["action"]
            if action == "pause":
                by = options["by"] or _user()
                changed = flow.pause_queue(options["queue"], by=by, using=using)
                self.stdout.write(f"Paused {options['queue']}." if changed
                                  else f"{options['queue']} was paused already.")
            elif action == "resume":
                changed = flow.resume_queue(options["queue"], using=using)
                self.stdout.write(f"Resumed {options['queue']}." if changed
                                  else f"{options['queue']} was not paused.")
            elif action == "sync":
                written = flow.sync_configured(using)
                self.stdout.write(f"Wrote SONIQ['QUEUES'] for: {', '.join(written)}." if written
                                  else "soniq_queue_settings already holds SONIQ['QUEUES'].")
            else:
                self._status(flow.queue_states(using))
        except (SoniqError, ConnectionDoesNotExist) as error:
            raise CommandError(f"soniq_queue {options['action']} failed: {error}") from None

    def _status(self, states: list[flow.QueueState]) -> None:
        if not states:
            self.stdout.write("(no queue has flow control)")
            return
        width = max(5, *(len(state.queue) for state in states))
        self.stdout.write(f"{'queue':<{width}}  {'state':<7}  {'concurrency':>11}  {'rate':>9}  "
                          f"{'running':>7}  {'queued':>7}")
        stale = False
        for state in states:
            marks = {field: "*" if field in state.overridden else "" for field in
                     ("concurrency", "rate")}
            concurrency = "-" if state.concurrency is None else str(state.concurrency)
            self.stdout.write(
                f"{state.queue:<{width}}  {'paused' if state.paused else 'active':<7}  "
                f"{concurrency + marks['concurrency']:>11}  "
                f"{_rate(state.rate) + marks['rate']:>9}  {state.running:>7}  {state.queued:>7}"
                + ("" if state.in_sync else "  (database differs from SONIQ['QUEUES'])"))
            stale = stale or not state.in_sync
        self.stdout.write("* an operator's override (the admin); otherwise SONIQ['QUEUES'].")
        if stale:
            self.stdout.write("Start a worker or run `manage.py soniq_queue sync` to write "
                              "SONIQ['QUEUES'] to the database.")


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return None
