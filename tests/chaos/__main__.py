"""``python -m tests.chaos``: the full chaos run (``make chaos``).

Defaults: 5,000 jobs, 4 workers x 2 threads, 8 SIGKILLs, 3 fast and 3
immediate PostgreSQL restarts, lease 2 s, heartbeat 0.5 s. Exit status 0
only if the checker proves the run clean (and every worker stopped cleanly).
"""

import argparse
import signal
import sys

from .cluster import ClusterUnavailable
from .driver import Config, run


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    defaults = Config()
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=defaults.jobs)
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument("--kills", type=int, default=defaults.kills)
    parser.add_argument("--fast-restarts", type=int, default=defaults.fast_restarts)
    parser.add_argument("--immediate-restarts", type=int, default=defaults.immediate_restarts)
    parser.add_argument("--lease", type=float, default=defaults.lease)
    parser.add_argument("--heartbeat", type=float, default=defaults.heartbeat)
    parser.add_argument("--seed", type=int, help="replay a run's random choices")
    parser.add_argument("--keep-logs", metavar="DIR",
                        help="write worker logs here (default: a temp dir, kept on failure)")
    args = parser.parse_args(argv)
    from pathlib import Path

    config = Config(
        jobs=args.jobs, workers=args.workers, concurrency=args.concurrency, kills=args.kills,
        fast_restarts=args.fast_restarts, immediate_restarts=args.immediate_restarts,
        lease=args.lease, heartbeat=args.heartbeat, seed=args.seed,
        log_dir=Path(args.keep_logs) if args.keep_logs else None,
    )
    # A SIGTERM must still run the clean-up (workers killed, cluster deleted).
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        outcome = run(config, say=lambda text: print(text, flush=True))
    except ClusterUnavailable as error:
        print(f"chaos: cannot start a private PostgreSQL cluster: {error}", file=sys.stderr)
        return 2
    print(outcome.summary())
    if not outcome.ok:
        print("\nFAILURES:", file=sys.stderr)
        for line in outcome.failures()[:60]:
            print(f"- {line}", file=sys.stderr)
        print(f"logs: {outcome.facts.log_dir}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
