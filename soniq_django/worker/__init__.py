"""The soniq_django worker (``manage.py soniq_worker``) and what handlers can ask of it."""

from .context import JobContext, current_job
from .loop import Worker

__all__ = ["JobContext", "Worker", "current_job"]
