"""Benchmarks of soniq_django against a raw-SQL ceiling and its peers (not tests).

Run ``make bench`` (full) or ``make bench-quick``; see docs/performance.md.
Everything in this package runs against the local PostgreSQL only, in
databases it creates (``soniq_bench_<pid>_*``) and drops at the end.
"""
