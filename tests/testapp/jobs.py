"""Handlers the tests enqueue; found by autodiscovery like any app's jobs."""

from soniq_django import job


@job(name="tests.add")
def add(a: int, b: int = 0) -> int:
    return a + b


@job(name="tests.unique_report", unique=True, queue="reports", retries=2)
def unique_report(day: str) -> str:
    return day


@job(name="tests.flexible")
def flexible(first, *rest, **extra):
    return [first, list(rest), extra]


@job(name="tests.positional_only")
def positional_only(a, /, b):
    return a + b
