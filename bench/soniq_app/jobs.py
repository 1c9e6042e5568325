from soniq_django import job

from bench.common import stamp


@job(name="bench.noop")
def noop(i: int = 0) -> None:
    stamp()


@job(name="bench.latency")
def latency(i: int) -> None:
    stamp(i)
