"""Django tasks the Tasks-backend tests enqueue and run with a real soniq worker.

Each is a module-level ``@task`` of the default TASKS backend
(SoniqTaskBackend; ``atomic_effect`` of the "atomic" one, a SoniqTaskBackend
with ``OPTIONS["atomic"]``), so its job name is its module path, e.g.
``tests.testapp.tasks.add``.
"""

import asyncio
import time

try:  # Django 6
    from django.tasks import task
except ImportError:  # the django-tasks backport
    from django_tasks import task


class TaskBoom(Exception):
    """What ``explode`` raises, so tests can find its class path in the error."""


@task()
def add(a, b, *, scale=1):
    return (a + b) * scale


@task(queue_name="tasks", priority=40)
def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}


@task()
async def async_double(n):
    await asyncio.sleep(0)
    return n * 2


@task(takes_context=True)
def with_context(context, label):
    result = context.task_result
    return {
        "label": label,
        "id": result.id,
        "attempt": context.attempt,
        "status": result.status.value,
        "args": result.args,
    }


@task(takes_context=True)
async def async_with_context(context, label):
    return {"label": label, "id": context.task_result.id, "attempt": context.attempt}


@task(takes_context=True)
def flaky(context):
    """Fails its first attempt, succeeds on the second."""
    if context.attempt < 2:
        raise TaskBoom(f"attempt {context.attempt}")
    return context.attempt


@task()
def explode(message):
    raise TaskBoom(message)


@task(backend="immediate")
def immediate_only(path):
    """A task of another backend: the soniq worker must not run it."""
    return not_a_task(path)


def not_a_task(path):
    """A plain module-level function: a job row naming it must never run it."""
    with open(path, "w") as handle:
        handle.write("ran")
    return "ran"


add_alias = add  # the same Task under another name: not its module path


@task(backend="atomic", takes_context=True)
def atomic_effect(context, note):
    """A task of the backend with OPTIONS["atomic"]: writes an Effect, fails its first attempt."""
    from soniq_django.worker import current_job
    from tests.testapp.models import Effect

    run = current_job()
    Effect.objects.create(job_id=run.job_id, generation=run.generation, attempt=context.attempt,
                          pid=0, note=note)
    if context.attempt < 2:
        raise TaskBoom(f"attempt {context.attempt}")
    return run.generation


@task(backend="timeouts")
def sleepy(seconds):
    """A task of the backend with OPTIONS["timeout"] = 1."""
    time.sleep(seconds)
    return seconds


# A soniq @job written in tasks.py, as a Celery or Django Tasks habit puts it:
# discovery imports every installed app's tasks module, as it does jobs.
from soniq_django import job  # noqa: E402


@job(name="tests.testapp.tasks.job_in_tasks_py")
def job_in_tasks_py(word):
    return word.upper()
