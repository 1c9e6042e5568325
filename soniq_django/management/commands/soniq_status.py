import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from soniq_django.management.database import (
    add_database_argument, database_alias, migrations_required,
)
from soniq_django.overview import STATUSES, queue_summary


class Command(BaseCommand):
    help = "Show how many jobs each queue holds in each state, and the live workers."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON, for machines.")
        add_database_argument(parser, reads=True)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = database_alias(options, reads=True)
        with migrations_required(alias):
            summary = queue_summary(alias)
        if options["json"]:
            self.stdout.write(json.dumps(summary, indent=2, sort_keys=True))
            return
        width = max([5, *(len(name) for name in summary["queues"])])
        self.stdout.write(f"{'queue':<{width}}  " + "  ".join(f"{s:>11}" for s in STATUSES)
                          + "  oldest queued")
        for name, counts in summary["queues"].items():
            age = summary["oldest_queued_seconds"].get(name)
            self.stdout.write(
                f"{name:<{width}}  " + "  ".join(f"{counts[s]:>11}" for s in STATUSES)
                + (f"  {age:.0f}s" if age is not None else "  -")
            )
        if not summary["queues"]:
            self.stdout.write("(no jobs)")
        reasons = ", ".join(f"{k}={v}" for k, v in summary["dead_letters_by_reason"].items())
        self.stdout.write(f"dead letters by reason: {reasons or 'none'}")
        self.stdout.write(f"live workers: {summary['live_workers']}")
