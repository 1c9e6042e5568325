"""What a test does when something it needs is missing: skip on a developer machine, fail in CI.

Under ``CI=true`` nothing may be skipped for want of a service or a tool
(PostgreSQL, a browser, a package): CI installs everything the tests need, so
a missing piece there is a failure to report, not a reason to test less.
"""

import os

import pytest

IN_CI = os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def unavailable(reason: str) -> None:
    """Skip the test with ``reason``; under CI=true fail it instead."""
    if IN_CI:
        pytest.fail(f"CI=true: {reason}")
    pytest.skip(reason)
