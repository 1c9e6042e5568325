"""``python -m tests.chaos``: the full chaos run (``make chaos``).

Two scenarios, the same driver and checker:

- plain (the default): 5,000 ``chaos.work`` jobs, 4 workers x 2 threads, 8
  SIGKILLs, 3 fast and 3 immediate PostgreSQL restarts, lease 2 s,
  heartbeat 0.5 s;
- ``--effects``: 5,000 atomic ``chaos.effect`` jobs, each writing one effect
  row in its job's transaction and sleeping 50-500 ms, with the same kills
  and restarts plus 3 SIGSTOPs of a worker past its lease (then SIGCONT) and
  8 rounds of ``pg_terminate_backend`` on worker backends. The checker also
  proves exactly one effect row per job, of the generation whose completion
  landed, and none from a refused run. ``--effects --control`` registers the
  handler without ``atomic=True``: the checker must then FAIL (exit 1).

- ``--workflows``: 10 batches of 200 ``chaos.work`` members, each with an
  ``on_complete`` callback, and 1,500 jobs in a random DAG of dependencies
  (chains, fan-in, jobs after a callback), 2 % of them failing for good, under
  the effects run's faults (kills, restarts, SIGSTOPs past the lease,
  terminated backends). The checker also proves every callback completed
  exactly once and started after its last member ended, no dependent started
  before its dependencies completed, and every dependent of a failed job was
  cancelled with ``dependency_failed:<id>`` (tests/chaos/workflows.py).
  ``--batches``, ``--batch-size`` and ``--dag-jobs`` size it (``--jobs`` does
  not apply).

- ``--steps``: 100 ``chaos.steps`` jobs of five atomic durable steps, each
  step inserting one effect row in its own transaction and sleeping (the job
  0.5-3 s in all), 2 % failing their first attempt between steps, under the
  effects run's faults (kills inside and between steps, restarts, SIGSTOPs
  past the lease, backends terminated mid-step and at a step's COMMIT). The
  checker also proves every (job, step) recorded once with exactly one effect
  row, the recording run's, and no step function called after its record
  committed (tests/chaos/steps.py, step_jobs.py). ``--steps --control`` takes the steps
  without ``atomic=True``: the checker must then FAIL, showing duplicates.

- ``--liveness``: the liveness scenario (tests/chaos/liveness.py, issue 26):
  a worker with k long jobs running while a limited queue's settings row is
  locked for 3 leases, an atomic job's COMMIT is lost (the backend left idle
  in transaction) and the worker's shared connection's backend is SIGSTOPped
  for 2 leases; 3 rounds of each, k = 6, lease 2 s. Every job must run once
  (the lost COMMIT's job: once more, its effect once) and another queue keep
  flowing. Only ``--lease``, ``--rounds``, ``--running`` and ``--keep-logs``
  apply to it.

Every option overrides the chosen scenario's default. Exit status 0 only if
the checker proves the run clean (and every worker stopped cleanly).
"""

import argparse
import dataclasses
import signal
import sys

from .cluster import ClusterUnavailable
from .driver import (Config, effects_config, keys_config, run, steps_config,
                     workflows_config)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--effects", action="store_true",
                        help="the effects scenario: atomic jobs, SIGSTOPs, terminated backends")
    parser.add_argument("--liveness", action="store_true",
                        help="the liveness scenario: a locked settings row, a lost COMMIT, "
                             "a stalled backend")
    parser.add_argument("--workflows", action="store_true",
                        help="the workflows scenario: batches with callbacks and a random DAG")
    parser.add_argument("--steps", action="store_true",
                        help="the steps scenario: jobs of five atomic durable steps")
    parser.add_argument("--keys", action="store_true",
                        help="the limits-per-key scenario: 300 jobs over 10 keys at "
                             "key_concurrency=1")
    parser.add_argument("--rounds", type=int, help="with --liveness: rounds of each fault "
                                                   "(default 3)")
    parser.add_argument("--running", type=int, help="with --liveness: jobs running on the "
                                                    "worker at each fault (default 6)")
    parser.add_argument("--control", action="store_true",
                        help="with --effects: the handler without atomic=True (must fail)")
    for name, kind in (("jobs", int), ("workers", int), ("concurrency", int), ("kills", int),
                       ("fast-restarts", int), ("immediate-restarts", int), ("stops", int),
                       ("terminations", int), ("lease", float), ("heartbeat", float),
                       ("batches", int), ("batch-size", int), ("dag-jobs", int)):
        parser.add_argument(f"--{name}", type=kind, help="(default: the scenario's)")
    parser.add_argument("--seed", type=int, help="replay a run's random choices")
    parser.add_argument("--keep-logs", metavar="DIR",
                        help="write worker logs here (default: a temp dir, kept on failure)")
    args = parser.parse_args(argv)
    if args.control and not (args.effects or args.steps):
        parser.error("--control needs --effects or --steps")
    from pathlib import Path

    if args.liveness:
        return _liveness(args)

    if args.workflows and args.effects:
        parser.error("--workflows and --effects are separate scenarios")
    if args.steps and (args.workflows or args.effects or args.keys):
        parser.error("--steps is a scenario of its own")
    if args.keys and (args.workflows or args.effects):
        parser.error("--keys is a scenario of its own")
    if args.steps:
        config = steps_config(control=args.control)
    elif args.keys:
        config = keys_config()
    elif args.workflows:
        config = workflows_config()
    else:
        config = effects_config(control=args.control) if args.effects else Config()
    overrides = {field: value for field in (
        "jobs", "workers", "concurrency", "kills", "fast_restarts", "immediate_restarts",
        "stops", "terminations", "lease", "heartbeat", "seed", "batches", "batch_size",
        "dag_jobs")
        if (value := getattr(args, field)) is not None}
    if args.keep_logs:
        overrides["log_dir"] = Path(args.keep_logs)
    config = dataclasses.replace(config, **overrides)
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


def _liveness(args) -> int:
    from pathlib import Path

    from .liveness import LivenessConfig, run as run_liveness

    config = LivenessConfig(rounds=3, running=6)
    overrides = {field: value for field in ("lease", "rounds", "running")
                 if (value := getattr(args, field)) is not None}
    if args.keep_logs:
        overrides["log_dir"] = Path(args.keep_logs)
    config = dataclasses.replace(config, **overrides)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        outcome = run_liveness(config, say=lambda text: print(text, flush=True))
    except ClusterUnavailable as error:
        print(f"chaos: cannot start a private PostgreSQL cluster: {error}", file=sys.stderr)
        return 2
    print(outcome.summary())
    if not outcome.ok:
        print("\nFAILURES:", file=sys.stderr)
        for line in outcome.violations[:60]:
            print(f"- {line}", file=sys.stderr)
        print(f"logs: {outcome.log_dir}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
