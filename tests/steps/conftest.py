import pytest

from tests.steps import handlers  # noqa: F401  (registers the steps tests' handlers)
from tests.support.workers import soniq


@pytest.fixture(autouse=True)
def fast_workers(settings):
    soniq(settings)


@pytest.fixture
def admin_client(client, django_user_model):
    """A client logged in as a superuser (no password hashed), as tests/admin has it."""
    client.force_login(django_user_model.objects.create_superuser("admin", "admin@example.com",
                                                                  password=None))
    return client
