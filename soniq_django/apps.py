from django.apps import AppConfig


class SoniqConfig(AppConfig):
    name = "soniq_django"
    label = "soniq_django"
    verbose_name = "Soniq jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        # Handlers live in each app's ``jobs`` module, as admin classes live
        # in ``admin``: importing them fills the registry once per process.
        autodiscover_modules("jobs")
        from . import checks  # noqa: F401  (registers the system checks)
