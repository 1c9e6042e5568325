"""Where ``JobRequest`` is imported from: ``soniq_django``, and its old path with a warning."""

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import soniq_django
from soniq_django.producer.request import JobRequest

ROOT = Path(__file__).resolve().parents[2]


def test_job_request_is_importable_from_the_package_with_bulk_enqueue():
    from soniq_django import JobRequest as public, bulk_enqueue  # noqa: F401

    assert public is JobRequest
    assert "JobRequest" in soniq_django.__all__ and "JobRequest" in dir(soniq_django)


def test_the_old_path_still_works_with_a_deprecation_warning_naming_the_new_one():
    old = importlib.import_module("soniq_django.job_request")
    with pytest.warns(DeprecationWarning, match=r"import JobRequest from soniq_django instead"):
        from soniq_django.job_request import JobRequest as moved
    assert moved is JobRequest
    with pytest.warns(DeprecationWarning, match=r"soniq_django\.producer\.request"):
        assert old.prepare is importlib.import_module("soniq_django.producer.request").prepare
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError):
            old.no_such_name  # noqa: B018  a name it never had: no warning, an AttributeError


def test_the_warning_points_at_the_importing_line():
    # -W error::DeprecationWarning turns it into an error raised at the user's import.
    code = "from soniq_django.job_request import JobRequest  # the line"
    done = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code],
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "DeprecationWarning: soniq_django.job_request is deprecated" in done.stderr
    assert 'File "<string>", line 1' in done.stderr
