"""Fixtures of the admin tests."""

import pytest


@pytest.fixture
def admin_client(client, django_user_model):
    """A client logged in as a superuser, without hashing a password (that takes a second).

    It replaces pytest-django's ``admin_client`` in this folder.
    """
    client.force_login(django_user_model.objects.create_superuser("admin", "admin@example.com",
                                                                  password=None))
    return client
