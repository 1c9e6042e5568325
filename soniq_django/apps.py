from django.apps import AppConfig


class SoniqConfig(AppConfig):
    name = "soniq_django"
    label = "soniq_django"
    verbose_name = "Soniq jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from .registry import discover

        # Handlers live in each app's ``jobs`` or ``tasks`` module, as admin classes live
        # in ``admin``, and in the modules SONIQ["IMPORTS"] names: importing
        # them fills the registry once per process. Every app's models are
        # loaded by now, so those modules may import models. A module that
        # fails to import is not raised here (every manage.py command would
        # fail with it): soniq.E009 names it, and soniq_worker refuses to start.
        discover()
        from . import checks  # noqa: F401  (registers the system checks)

        # Django Tasks (``django.tasks`` on Django 6, else the backport): let the
        # worker run ``@task`` functions whose backend is SoniqTaskBackend.
        if _tasks_framework_installed():
            from .registry import register_resolver
            from .tasks_backend import find_task_handler

            register_resolver(find_task_handler)


def _tasks_framework_installed() -> bool:
    from importlib.util import find_spec

    return find_spec("django.tasks") is not None or find_spec("django_tasks") is not None
