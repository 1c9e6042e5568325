import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils.connection import ConnectionDoesNotExist

from soniq_django import flow
from soniq_django.keys import limits as key_limits
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
        keys = actions.add_parser("keys", help="The keys of limits per key with jobs running "
                                              "or waiting, those at their limit first.")
        keys.add_argument("--queue")
        keys.add_argument("--at-limit", action="store_true", help="Only the keys at their limit.")
        limit = actions.add_parser("limit-key", help="Override the limits of a queue's keys "
                                                     "matching a pattern ('*': any text), "
                                                     "at once, on every worker.")
        limit.add_argument("queue")
        limit.add_argument("key_pattern")
        limit.add_argument("--concurrency", type=int)
        limit.add_argument("--rate", help="N/s, N/m or N/h")
        clear = actions.add_parser("clear-key", help="Remove an override: the jobs' declared "
                                                     "limits apply again.")
        clear.add_argument("queue")
        clear.add_argument("key_pattern")
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
            elif action == "keys":
                self._keys(key_limits.key_states(queue=options["queue"], using=using,
                                                 at_limit_only=options["at_limit"]))
            elif action == "limit-key":
                if options["concurrency"] is None and options["rate"] is None:
                    raise CommandError("soniq_queue limit-key: give --concurrency or --rate (or "
                                       "both); clear-key removes an override")
                seen = key_limits.set_key_limit(
                    options["queue"], options["key_pattern"],
                    concurrency=options["concurrency"], rate=options["rate"], using=using)
                self.stdout.write(f"Limited {options['key_pattern']} in {options['queue']} "
                                  f"({seen} key(s) with jobs now).")
            elif action == "clear-key":
                cleared = key_limits.clear_key_limit(options["queue"], options["key_pattern"],
                                                     using=using)
                self.stdout.write("Cleared." if cleared else "No such override.")
            elif action == "sync":
                written = flow.sync_configured(using)
                self.stdout.write(f"Wrote SONIQ['QUEUES'] for: {', '.join(written)}." if written
                                  else "soniq_queue_settings already holds SONIQ['QUEUES'].")
            else:
                self._status(flow.queue_states(using))
        except (SoniqError, ConnectionDoesNotExist) as error:  # ConfigValidationError too
            raise CommandError(f"soniq_queue {options['action']} failed: {error}") from None

    def _keys(self, states: list[key_limits.KeyState]) -> None:
        if not states:
            self.stdout.write("(no key has jobs running or waiting)")
            return
        width = max(3, *(len(state.key) for state in states))
        self.stdout.write(f"{'queue':<12}  {'key':<{width}}  {'concurrency':>11}  {'rate':>9}  "
                          f"{'running':>7}  {'waiting':>7}")
        for state in states:
            concurrency = "-" if state.concurrency is None else str(state.concurrency)
            self.stdout.write(
                f"{state.queue:<12}  {state.key:<{width}}  {concurrency:>11}  "
                f"{_rate(state.rate):>9}  {state.running:>7}  {state.waiting:>7}"
                + ("  at its limit" if state.at_limit else ""))

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
