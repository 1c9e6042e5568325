import pytest

from tests.steps import handlers  # noqa: F401  (registers the steps tests' handlers)
from tests.support.workers import soniq


@pytest.fixture(autouse=True)
def fast_workers(settings):
    soniq(settings)
