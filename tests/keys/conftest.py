"""Fixtures of the keys tests."""

import pytest

from soniq_django.owned import OwnedJobSource


@pytest.fixture
def source():
    return OwnedJobSource()
