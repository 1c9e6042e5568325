"""The benchmark's jobs for soniq_django (found by the app's ``jobs`` autodiscovery)."""
from soniq_django import job

from bench.common import stamp
from bench.soniq_app.models import Effect


@job(name="bench.noop")
def noop(i: int = 0) -> None:
    stamp()


@job(name="bench.latency")
def latency(i: int) -> None:
    stamp(i)


# The price of atomic=True: the same one-row write, as a plain job and as an atomic one.


def _write_one_row(i: int) -> None:
    stamp()
    Effect.objects.create(i=i)


@job(name="bench.write")
def write(i: int = 0) -> None:
    _write_one_row(i)


@job(name="bench.write_atomic", atomic=True)
def write_atomic(i: int = 0) -> None:
    _write_one_row(i)


@job(name="bench.anoop")
async def anoop(i: int = 0) -> None:
    """The no-op as an ``async def`` handler: it runs on the worker's event loop."""
    stamp()
