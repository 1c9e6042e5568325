"""What a durable step costs per call (issue 30): ``current_job().step()``, plain and atomic.

One ``soniq_tasks`` process (action ``steps N``) enqueues one job, claims it
through ``OwnedJobSource`` and times ``N`` calls of each kind on one run's
context, against the database alone (no worker, no other load):

- ``plain``: a new step whose function returns a small dict: the lookup
  (``soniq_get_step``), the call, the record (``soniq_record_step``, fenced);
- ``atomic``: the same with ``atomic=True``: BEGIN, the lookup... the record as
  the transaction's last statement (its bounds sent with it), COMMIT;
- ``atomic_write``: an atomic step whose function also inserts one row (the
  bench's own table) -- what a step with one ORM write costs;
- ``skipped``: a later run (the lease lapsed, the job claimed again) asking for
  steps already recorded: the lookup alone, the function not called.

Each row is microseconds per call (the mean of the N calls); fewer is better.
"""

KINDS = ("plain", "atomic", "atomic_write", "skipped")
LABELS = {"plain": "step(), plain (lookup + call + fenced record)",
          "atomic": "step(atomic=True) (+ BEGIN/COMMIT, record last)",
          "atomic_write": "step(atomic=True) with one INSERT in it",
          "skipped": "step() already recorded (lookup only)"}


def step_costs(count: int) -> dict:
    """Run in the soniq process (Django set up): µs per call of each kind."""
    import datetime as dt
    import secrets
    import time

    from django.db import connection

    from soniq_django import enqueue
    from soniq_django.owned import OwnedJobSource
    from soniq_django.worker.context import JobContext, _current, bind

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_step_effects (id bigserial PRIMARY KEY, "
                       "job_id uuid NOT NULL, name text NOT NULL)")
        cursor.execute("TRUNCATE bench_step_effects, soniq_job_steps")
    source = OwnedJobSource()
    job_id = enqueue("bench.noop", {"i": -2}, queue="bench_steps", max_attempts=10)

    def run() -> JobContext:
        claimed = source.claim_next_owned("bench-steps", claim_token=secrets.token_hex(16),
                                          queues=["bench_steps"])
        assert claimed is not None
        fence = claimed.claim_fence
        context = JobContext(job_id=fence.job_id, job_name=claimed.job_name,
                             queue=claimed.queue, attempts=claimed.attempts,
                             max_attempts=claimed.max_attempts, generation=fence.generation,
                             _fence=fence, _using="default")
        bind(context)
        return context

    def write(name: str) -> dict:
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO bench_step_effects (job_id, name) VALUES (%s, %s)",
                           [job_id, name])
        return {"name": name}

    def timed(context: JobContext, kind: str, fn, atomic: bool) -> float:
        started = time.perf_counter()
        for i in range(count):
            name = f"{kind}:{i}"
            context.step(name, fn, name, atomic=atomic)
        return (time.perf_counter() - started) / count * 1e6

    first = run()
    found = {"plain": timed(first, "plain", lambda name: {"name": name}, False),
             "atomic": timed(first, "atomic", lambda name: {"name": name}, True),
             "atomic_write": timed(first, "atomic_write", write, True)}
    with connection.cursor() as cursor:  # the lease lapses: the next claim is a new run
        cursor.execute("SELECT set_config('soniq.fenced_write', 'on', false)")
        cursor.execute("UPDATE soniq_jobs SET lease_expires_at = %s WHERE id = %s",
                       [dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1), job_id])
        cursor.execute("SELECT set_config('soniq.fenced_write', 'off', false)")
    second = run()
    found["skipped"] = timed(second, "plain", lambda name: 1 / 0, False)
    _current.set(None)
    return found


def measure(cfg, soniq, res, rep: int) -> None:
    found = soniq.action("steps", cfg.steps_calls)
    for kind in KINDS:
        res.add(f"soniq.step_{kind}", found[kind])


def render(cfg, res, lines: list, row) -> None:
    if "soniq.step_plain" not in res.values:
        return
    lines.append(f"DURABLE STEPS (issue 30): µs per call, {cfg.steps_calls:,} calls of each on "
                 f"one run, against the database alone")
    for kind in KINDS:
        row(LABELS[kind], f"soniq.step_{kind}", unit="µs", digits=0)
