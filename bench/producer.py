"""The producer rows of the benchmark alone, in a few seconds: ``python -m bench.producer``.

Measures, against a scratch database of its own (``soniq_bench_producer_<pid>``,
dropped at the end):

- one job per transaction, in alternating chunks: raw prepared INSERT into
  ``raw_jobs`` (``LIKE soniq_jobs INCLUDING ALL``), ``soniq_django.enqueue()``
  and ``SELECT soniq_enqueue()`` via psycopg, prepared (bench.run's
  ``enqueue_interleaved``);
- ``bulk_enqueue()`` of N jobs (building the ``JobRequest``s included), and its
  parts: ``prepare()`` of N requests and the database call.

Only a local PostgreSQL (bench/common.py); project .venv.
"""

import argparse
import os
import statistics
import sys
import time


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--enqueue-jobs", type=int, default=1000)
    parser.add_argument("--bulk-jobs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-single", action="store_true")
    parser.add_argument("--skip-bulk", action="store_true")
    opts = parser.parse_args(argv)

    from bench import common, raw

    db = f"soniq_bench_producer_{os.getpid()}"
    os.environ["BENCH_DB_NAME"] = db
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.soniq_settings"
    common.create_database(db)
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0, skip_checks=True)
        connection.close()
        raw.create_raw_table(db)
        if not opts.skip_single:
            _single(db, opts, common, raw)
        if not opts.skip_bulk:
            _bulk(db, opts, common)
        connection.close()
    finally:
        from django.db import connections

        connections.close_all()
        common.drop_database(db)


def _reset(db, common) -> None:
    with common.connect(db) as conn:
        conn.execute("TRUNCATE soniq_jobs, raw_jobs")
    common.quiesce(db)


def _single(db, opts, common, raw) -> None:
    from bench.run import enqueue_interleaved

    ratios, ratios_sql = [], []
    for rep in range(opts.repeat):
        _reset(db, common)
        rates = enqueue_interleaved(db, db, opts.enqueue_jobs)
        ratios.append(rates["soniq.enqueue"] / rates["raw.insert"])
        ratios_sql.append(rates["soniq.sqlfn"] / rates["raw.insert"])
        print(f"rep {rep}: raw INSERT {rates['raw.insert']:,.0f}/s, enqueue() "
              f"{rates['soniq.enqueue']:,.0f}/s ({ratios[-1]:.2f}x), SELECT soniq_enqueue() "
              f"{rates['soniq.sqlfn']:,.0f}/s ({ratios_sql[-1]:.2f}x)", flush=True)
    print(f"enqueue() / raw INSERT: median {statistics.median(ratios):.2f}x; "
          f"SELECT soniq_enqueue() / raw INSERT: median {statistics.median(ratios_sql):.2f}x")


def _bulk(db, opts, common) -> None:
    from django.db import connection

    from soniq_django import bulk_enqueue, enqueue
    from soniq_django.producer.request import JobRequest, prepare

    count = opts.bulk_jobs
    rates, prepares = [], []
    for rep in range(opts.repeat):
        _reset(db, common)
        enqueue("bench.noop", {"i": -1})  # connect, warm up
        started = time.perf_counter()
        ids = bulk_enqueue(JobRequest("bench.noop", {"i": i}) for i in range(count))
        elapsed = time.perf_counter() - started
        assert len(ids) == count
        started = time.perf_counter()
        for i in range(count):
            prepare(JobRequest("bench.noop", {"i": i}))
        prepares.append((time.perf_counter() - started) * 1000)
        rates.append(count / elapsed)
        print(f"rep {rep}: bulk_enqueue() of {count:,}: {rates[-1]:,.0f} jobs/s "
              f"({elapsed * 1000:.0f} ms; building + prepare() alone {prepares[-1]:.0f} ms)",
              flush=True)
        connection.close()
    print(f"bulk_enqueue() of {count:,}: median {statistics.median(rates):,.0f} jobs/s")


if __name__ == "__main__":
    main(sys.argv[1:])
