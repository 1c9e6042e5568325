"""Fixtures of the migration, admission and downgrade tests."""

import pytest
from django.db import connection

from tests.support.schema import migrate, restore_latest


@pytest.fixture
def at_latest_afterwards(transactional_db):
    """Run the test with real transactions; migrate back to the latest state at the end."""
    yield
    connection.close()  # drop any per-connection state a test installed
    restore_latest()


@pytest.fixture
def at_format1(at_latest_afterwards):
    """Start the test with soniq_django migrated back to 0002: no owned metadata."""
    migrate("0002")
    yield
