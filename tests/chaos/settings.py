"""Settings for the chaos run's processes (workers and the preparation step).

tests.worker_settings with the chaos app added, so its handler
(tests/chaos/jobs.py) is autodiscovered. The database comes from
``SONIQ_WORKER_DATABASE_URL`` (the chaos run's own cluster), soniq settings
from ``SONIQ_<NAME>`` variables holding JSON, as for tests.worker_settings.
"""

from tests.worker_settings import *  # noqa: F403
from tests.worker_settings import INSTALLED_APPS as _APPS

INSTALLED_APPS = [*_APPS, "tests.chaos"]
