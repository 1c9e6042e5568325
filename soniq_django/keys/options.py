"""``@job(concurrency_key=..., key_concurrency=..., key_rate=...)``: the checks, and a job's key.

The key is computed when the job is enqueued, from the keyword arguments
stored in its row, so a worker in any language sees it without running
Python: the value of the argument ``concurrency_key`` names (a string, or
an integer written in decimal), or what the callable returns for them (a
string). Messages name the option or argument, never its value.
"""

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ..errors import ConfigValidationError, ErrorCode
from ..flow import MAX_LIMIT, parse_rate

#: The longest key (the key columns are compared as 255-character identities).
MAX_KEY_LENGTH = 255

KeySource = str | Callable[..., str]
_UNITS = {1: "s", 60: "m", 3600: "h"}


@dataclasses.dataclass(frozen=True, slots=True)
class KeyOptions:
    """A handler's key options, checked: where its key comes from, and its limits."""

    source: KeySource
    concurrency: int | None = None
    rate: str | None = None
    """As written (``"5/s"``): what ``soniq_enqueue_keyed`` takes."""


@dataclasses.dataclass(frozen=True, slots=True)
class JobKey:
    """A job's key and the limits its enqueue declares (``PreparedJob.key``)."""

    key: str
    concurrency: int | None = None
    rate: str | None = None


def _kind(value: Any) -> str:
    return f"a value of type {type(value).__name__}"


def handler_options(func: Callable[..., Any], concurrency_key: Any, key_concurrency: Any,
                    key_rate: Any) -> KeyOptions | None:
    """The checked key options of ``@job`` on ``func``; None when it has none.

    Raises ``ImproperlyConfigured`` with one short message per rule.
    """
    if concurrency_key is None:
        if key_concurrency is not None or key_rate is not None:
            raise ImproperlyConfigured(
                "@job(key_concurrency=..., key_rate=...) need concurrency_key=: the argument "
                "name (or a callable of the job's arguments) that gives each job its key")
        return None
    if isinstance(concurrency_key, str):
        parameters = inspect.signature(func).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        if concurrency_key not in parameters and not takes_any:
            raise ImproperlyConfigured(
                f"@job(concurrency_key={concurrency_key!r}) names no argument of "
                f"{func.__qualname__}")
    elif not callable(concurrency_key):
        raise ImproperlyConfigured(
            f"@job(concurrency_key=...) must be an argument name or a callable, not "
            f"{_kind(concurrency_key)}")
    limit, rate = checked_limits(key_concurrency, key_rate, lambda name: f"@job({name}=...)")
    return KeyOptions(concurrency_key, limit, rate)


def checked_limits(key_concurrency: Any, key_rate: Any, option: Callable[[str], str]
                   ) -> tuple[int | None, str | None]:
    """A key's limits as declared (``@job``'s, a Tasks backend's OPTIONS'), checked: the
    concurrency a whole number from 1 to ``MAX_LIMIT`` or None, the rate as
    ``normal_rate`` gives it. ``option(name)`` names an option in the messages; raises
    ``ImproperlyConfigured``."""
    if key_concurrency is not None and (
            type(key_concurrency) is not int or not 1 <= key_concurrency <= MAX_LIMIT):
        raise ImproperlyConfigured(
            f"{option('key_concurrency')} must be a whole number from 1 to {MAX_LIMIT}, or None")
    if key_rate is not None:
        try:
            key_rate = normal_rate(key_rate)
        except ValueError as error:
            raise ImproperlyConfigured(f"{option('key_rate')}: {error}") from None
    return key_concurrency, key_rate


def normal_rate(value: Any) -> str:
    """A rate as ``soniq_enqueue_keyed`` takes it (``" 5 / s"`` -> ``"5/s"``); ``ValueError``
    for what ``flow.parse_rate`` refuses."""
    count, period = parse_rate(value)
    return f"{count}/{_UNITS[period]}"


def check_key(value: Any, what: str = "concurrency_key") -> str:
    """``value`` as a key: a non-empty string of at most ``MAX_KEY_LENGTH`` characters,
    without NUL. Raises ``ConfigValidationError(INVALID_OPTION)``."""
    if type(value) is not str:
        raise ConfigValidationError(f"{what} must be a string, not {_kind(value)}",
                                    code=ErrorCode.INVALID_OPTION)
    if not 0 < len(value) <= MAX_KEY_LENGTH or "\x00" in value:
        raise ConfigValidationError(
            f"{what} must be 1 to {MAX_KEY_LENGTH} characters, without NUL",
            code=ErrorCode.INVALID_OPTION)
    return value


def key_of(options: KeyOptions, job_name: str, stored: dict[str, Any],
           defaults: dict[str, Any]) -> JobKey:
    """The key of a job of ``job_name`` whose row carries ``stored`` (its keyword arguments;
    ``defaults``: the function's defaults for those not given).

    Raises ``ConfigValidationError(INVALID_OPTION)`` when the argument is missing or not a
    string or an integer, or the callable raises or returns something else than a key.
    """
    source = options.source
    if isinstance(source, str):
        if source in stored:
            value = stored[source]
        elif source in defaults:
            value = defaults[source]
        else:
            raise ConfigValidationError(
                f"job {job_name}: its concurrency_key argument {source!r} was not given",
                code=ErrorCode.INVALID_OPTION)
        if type(value) is int:
            value = str(value)
        key = check_key(value, f"job {job_name}: argument {source!r} (its concurrency_key)")
    else:
        try:
            value = source(**stored)
        except Exception as error:
            raise ConfigValidationError(
                f"job {job_name}: its concurrency_key callable raised {type(error).__name__}",
                code=ErrorCode.INVALID_OPTION) from error
        key = check_key(value, f"job {job_name}: what its concurrency_key callable returned")
    return JobKey(key, options.concurrency, options.rate)
