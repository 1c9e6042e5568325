"""One exception tree: every class under SoniqError, in errors.py, with a code."""

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

import soniq_django
from soniq_django import errors
from soniq_django.errors import (
    INPUT_CODES, ConfigValidationError, DowngradeRefused, ErrorCode, JobCancelled,
    PermanentFailure, SchemaAdmissionError, SoniqError, TablesShapeError,
)

PACKAGE = Path(soniq_django.__file__).parent


def _modules():
    for info in pkgutil.walk_packages([str(PACKAGE)], "soniq_django."):
        if ".migrations." in info.name or info.name.endswith(".migrations"):
            continue
        yield importlib.import_module(info.name)


def test_every_exception_class_of_the_package_lives_in_errors_under_soniq_error():
    found = {
        (module.__name__, name)
        for module in _modules()
        for name, value in vars(module).items()
        if inspect.isclass(value) and issubclass(value, BaseException)
        and value.__module__.startswith("soniq_django")
    }
    assert found, "the walk found no exception class at all"
    outside = sorted(f"{m}.{n}" for m, n in found
                     if getattr(importlib.import_module(m), n).__module__ != "soniq_django.errors")
    assert outside == [], f"exception classes defined outside errors.py: {outside}"
    for module, name in found:
        assert issubclass(getattr(importlib.import_module(module), name), SoniqError), name


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigValidationError("x"), ErrorCode.CONFIG),
        (SchemaAdmissionError([]), ErrorCode.SCHEMA_REFUSED),
        (TablesShapeError("x"), ErrorCode.SCHEMA_REFUSED),
        (DowngradeRefused(type("R", (), {"protected_jobs": 1, "protected_dead_letters": 0,
                                          "active_claims": 0, "held_back_keyed_jobs": 0})()),
         ErrorCode.QUEUE_SUBMISSION_CONFLICT),
        (PermanentFailure("card declined"), ErrorCode.PERMANENT_FAILURE),
        (JobCancelled(), ErrorCode.JOB_CANCELLED),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else "",
)
def test_each_class_carries_its_code_and_a_bounded_reason(error, code):
    assert isinstance(error, SoniqError)
    assert error.code is code
    assert error.reason and len(error.reason) <= 200


def test_the_handler_signals_keep_their_constructors_and_messages():
    # The worker writes str(error) into last_error: it stays the handler's text.
    failure = PermanentFailure("card declined")
    assert str(failure) == "card declined" and failure.args == ("card declined",)
    assert failure.reason == "card declined"
    long = PermanentFailure("x" * 500)
    assert str(long) == "x" * 500 and len(long.reason) == 200
    assert str(PermanentFailure()) == "" and PermanentFailure().reason == "PERMANENT_FAILURE"
    assert str(JobCancelled()) == "" and JobCancelled().args == ()


def test_schema_admission_error_is_still_an_improperly_configured_with_its_message():
    problem = type("P", (), {"rule": "varchar-required", "message": "soniq_jobs.claim_token: no"})
    error = SchemaAdmissionError([problem])
    assert isinstance(error, ImproperlyConfigured)
    assert str(error) == "owned-queue schema refused:\n- soniq_jobs.claim_token: no"
    assert error.reason == "owned-queue schema refused: 1 problem(s) (rules varchar-required)"


def test_the_old_import_locations_name_the_same_classes():
    from soniq_django.schema import admission, owned_metadata, worker_tables

    assert admission.SchemaAdmissionError is SchemaAdmissionError
    assert owned_metadata.DowngradeRefused is DowngradeRefused
    assert worker_tables.TablesShapeError is TablesShapeError


def test_a_validation_error_takes_only_a_code_of_bad_input():
    for code in INPUT_CODES:
        assert ConfigValidationError("x", code=code).code is code
    with pytest.raises(ValueError):
        ConfigValidationError("x", code=ErrorCode.QUEUE_PERSISTENCE_FAILED)


def _plain_raises_of_input_codes(path: Path) -> list[str]:
    """``SoniqError(ErrorCode.<bad-input code>, ...)`` calls in one file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "SoniqError" and node.args
                and isinstance(node.args[0], ast.Attribute)
                and node.args[0].attr in {code.name for code in INPUT_CODES}):
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_bad_input_is_always_raised_as_a_config_validation_error():
    found = [hit for path in sorted(PACKAGE.rglob("*.py"))
             for hit in _plain_raises_of_input_codes(path)]
    assert found == [], f"plain SoniqError with a bad-input code: {found}"
    assert errors.ConfigValidationError.__mro__[1] is SoniqError
