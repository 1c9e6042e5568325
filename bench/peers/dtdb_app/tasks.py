from django_tasks import task

from bench.common import stamp


@task()
def noop(i: int = 0) -> None:
    stamp()


@task()
def latency(i: int) -> None:
    stamp(i)
