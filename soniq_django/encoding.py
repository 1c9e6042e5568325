"""Job arguments as standard JSON, and their canonical encoding.

``normalize_args`` is the gate every job's args pass through: it accepts a
JSON object of finite standard JSON and returns a private deep copy with
string keys. ``canonical_json`` and ``args_hash`` implement format 1's
``args_hash`` rule byte for byte, so Python, SQL (``soniq_args_hash``) and
other languages agree.

Both walk values iteratively: hostile input (deep nesting, cycles) is refused
at the depth bound instead of exhausting the interpreter's stack.
"""

import hashlib
import math
from collections.abc import Callable
from decimal import Decimal
from json.encoder import encode_basestring_ascii
from typing import Any

from .errors import ConfigValidationError, ErrorCode

#: The args object itself is level 1; containers may nest to this level.
MAX_NESTING = 499

_SCALARS = (str, int, float, bool, type(None))


def _invalid(reason: str) -> ConfigValidationError:
    return ConfigValidationError(reason, code=ErrorCode.TASK_ARGS_INVALID)


#: The longest argument name a message shows.
MAX_SHOWN_NAME = 64


def _argument(name: str) -> str:
    """An argument as a message names it.

    By its name when that is an identifier of at most ``MAX_SHOWN_NAME``
    characters -- the only kind of name a handler's parameter can have; any
    other key can only reach a ``**kwargs`` and may be the caller's data, so
    it is not shown.
    """
    if name.isidentifier() and len(name) <= MAX_SHOWN_NAME:
        return f"argument {name!r}"
    return "an argument whose name is not an identifier"


class _Where:
    """Where a refused value sits, as messages say it: an argument, never its contents.

    ``normalize_args`` names the top-level argument (``argument 'when'``, or
    ``inside argument 'when'`` for a value nested in it); nested keys and
    values are the caller's data and are never shown. The texts are made
    only when a message needs them: most args are never refused.
    """

    __slots__ = ("_top", "_name")

    def __init__(self, top: str | None = None, *, name: str = ""):
        self._top, self._name = top, name

    @property
    def top(self) -> str:
        if self._top is None:
            self._top = _argument(self._name)
        return self._top

    @property
    def nested(self) -> str:
        return f"inside {self.top}"

    @property
    def nested_key(self) -> str:
        return f"{self.nested}: an object key"

    def at(self, depth: int) -> str:
        return self.top if depth <= 1 else self.nested


def _fine(value: Any) -> bool:
    """Whether ``_scalar`` accepts ``value`` as it is, decided cheaply for the usual scalars
    (False means: ask ``_scalar``, which refuses or accepts with its message)."""
    kind = type(value)
    if kind is str:
        return value.isascii() and "\x00" not in value  # ASCII has no lone surrogate
    if kind is int:
        exact: bool = -_EXACT_FLOAT < value < _EXACT_FLOAT
        return exact
    return kind is bool or value is None


#: Integers below this magnitude always convert to a 64-bit float.
_EXACT_FLOAT = 2**1000


def encodable(text: str) -> bool:
    """Whether the databases can store ``text``: UTF-8 encodes it (it holds no lone surrogate).

    A Python string may hold lone surrogates (``"\\ud800"``; bytes of a command line
    that are not UTF-8, decoded with ``surrogateescape``); the drivers cannot send them.
    The validators of every text input call this (ASCII text is decided at once).
    """
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def storable(text: str) -> str:
    """``text`` with what the databases cannot store written as escapes: NUL as ``\\x00``,
    a lone surrogate as ``\\udXXX``. For free text soniq writes on a caller's behalf (a
    handler's error message in ``last_error``), where refusing would lose the write."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if encodable(text):
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _check_text(text: str, what: str) -> None:
    if "\x00" in text:
        raise _invalid(f"{what} holds a NUL character, which PostgreSQL cannot store")
    if not encodable(text):
        raise _invalid(f"{what} holds a lone surrogate, which is not valid Unicode")


def _scalar(value: Any, where: str) -> Any:
    """Return a JSON scalar unchanged, or raise for anything that is not one."""
    kind = type(value)
    if kind is str:
        _check_text(value, f"{where}: a string")
    elif kind is float:
        if not math.isfinite(value):
            raise _invalid(f"{where}: NaN and Infinity are not JSON")
    elif kind is int:
        try:
            float(value)
        except OverflowError:
            raise _invalid(f"{where}: a number too large for a 64-bit float") from None
    elif kind not in (bool, type(None)):
        raise _invalid(f"{where}: a value of type {kind.__name__} is not standard JSON")
    return value


def _key(key: Any, where: str) -> str:
    """Turn a dict key into a JSON object key the way ``json.dumps`` does."""
    kind = type(key)
    if kind is str:
        _check_text(key, where)
        text: str = key
        return text
    if kind is bool:
        return "true" if key else "false"
    if key is None:
        return "null"
    if kind is int:
        return str(key)
    if kind is float and math.isfinite(key):
        return float.__repr__(key)
    raise _invalid(f"{where} is of type {kind.__name__}, not a string")


def normalize_json(value: Any, what: str = "the value") -> Any:
    """Validate any JSON value (a job result, say) and return a plain copy.

    The same rules as ``normalize_args``, without requiring an object;
    messages call the value ``what``.
    """
    where = _Where(what)
    return _normalize({"value": value}, lambda _: where)["value"]


def normalize_args(args: Any) -> dict[str, Any]:
    """Validate job args and return a deep copy made of plain JSON values.

    Raises ``ConfigValidationError(TASK_ARGS_INVALID)`` unless ``args`` is a dict whose
    contents are dicts, lists/tuples, str, int, float, bool or None, with
    finite numbers within float64 range, no NUL characters, no lone
    surrogates, no two keys that stringify alike, and at most
    ``MAX_NESTING`` levels of nesting. The message names the argument (the
    top-level key, when it is an identifier: see ``_argument``) the refused
    value is in, and the value's type; never the value.
    """
    if not isinstance(args, dict):
        raise _invalid("args must be a JSON object (a dict of keyword arguments), not "
                       + type(args).__name__)
    if type(args) is dict and _flat(args):
        return args.copy()
    return _normalize(args, _named)


def _flat(args: dict[str, Any]) -> bool:
    """Whether ``_normalize`` would return a plain copy of ``args`` as it stands, decided
    cheaply: every key is text and every value a scalar that ``_fine`` accepts (False
    means: ask ``_normalize``)."""
    for key, value in args.items():
        if type(key) is not str or not key.isascii() or "\x00" in key:
            return False
        kind = type(value)
        if kind is str:
            if not value.isascii() or "\x00" in value:
                return False
        elif kind is int:
            if not -_EXACT_FLOAT < value < _EXACT_FLOAT:
                return False
        elif kind is not bool and value is not None:
            return False
    return True


def _named(name: str) -> _Where:
    return _Where(name=name)


def _normalize(args: dict[str, Any], place: Callable[[str], _Where]) -> dict[str, Any]:
    """The walk of ``normalize_args``; ``place(name)`` says where an argument's values are."""
    root: dict[str, Any] = {}
    pending: list[tuple[Any, Any, int, _Where | None]] = [(args, root, 1, None)]
    while pending:
        source, target, depth, where = pending.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for raw_key, value in items:
            if where is None:  # the top level: each key names an argument
                key = raw_key if type(raw_key) is str and _fine(raw_key) else _key(
                    raw_key, "an argument name")
                if key in target:
                    raise _invalid("two argument names are the same once turned into strings")
                inner = place(key)
            else:
                inner = where
                if type(target) is dict:
                    key = raw_key if _fine(raw_key) and type(raw_key) is str else _key(
                        raw_key, inner.nested_key)
                    if key in target:
                        raise _invalid(f"{inner.nested}: two object keys are the same once "
                                       "turned into strings")
            if isinstance(value, dict):
                child: Any = {}
            elif isinstance(value, (list, tuple)):
                child = []
            else:
                child = None
            if child is not None:
                if depth + 1 > MAX_NESTING:
                    raise _invalid(f"{inner.nested}: args nest deeper than {MAX_NESTING} levels")
                pending.append((value, child, depth + 1, inner))
                copied = child
            else:
                copied = value if _fine(value) else _scalar(value, inner.at(depth))
            if type(target) is dict:
                target[key] = copied
            else:
                target.append(copied)
    return root


def postgres_number(value: int | float) -> str:
    """Render a number as PostgreSQL prints it back from ``jsonb``.

    Integers are plain digits. A float goes through its shortest repr (what
    ``json.dumps`` writes) and comes out in plain decimal with the scale
    PostgreSQL's ``numeric`` keeps: ``1e16`` → ``10000000000000000``,
    ``1e-7`` → ``0.0000001``, ``-0.0`` → ``0.0``.
    """
    if type(value) is int:
        return str(value)
    text = format(Decimal(float.__repr__(value)), "f")
    if text.startswith("-") and value == 0:
        text = text[1:]
    return text


class _Raw(str):
    """Already-encoded output, as opposed to a string value still to encode."""


_OPEN = {dict: _Raw("{"), list: _Raw("[")}
_CLOSE = {dict: _Raw("}"), list: _Raw("]")}
_COMMA = _Raw(",")


def _encode(value: Any) -> str:
    out: list[str] = []
    pending: list[Any] = [value]
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is _Raw:
            out.append(item)
        elif kind is dict:
            keys = sorted(item)
            pending.append(_CLOSE[dict])
            for index in range(len(keys) - 1, -1, -1):
                pending.append(item[keys[index]])
                pending.append(_Raw(encode_basestring_ascii(keys[index]) + ":"))
                if index:
                    pending.append(_COMMA)
            pending.append(_OPEN[dict])
        elif kind is list:
            pending.append(_CLOSE[list])
            for index in range(len(item) - 1, -1, -1):
                pending.append(item[index])
                if index:
                    pending.append(_COMMA)
            pending.append(_OPEN[list])
        elif kind is str:
            out.append(encode_basestring_ascii(item))
        elif item is None:
            out.append("null")
        elif kind is bool:
            out.append("true" if item else "false")
        else:
            out.append(postgres_number(item))
    return "".join(out)


def canonical_json(args: Any) -> str:
    """The canonical text of job args that ``args_hash`` is taken over.

    Keys sorted at every level, ``,``/``:`` separators, strings escaped as
    ``json.dumps`` escapes them by default (ASCII only, lowercase ``\\uXXXX``,
    surrogate pairs above U+FFFF) and numbers as PostgreSQL prints them.
    Raises ``ConfigValidationError(TASK_ARGS_INVALID)`` for args ``normalize_args`` refuses.
    """
    return _encode(normalize_args(args))


def args_hash(args: Any) -> str:
    """SHA-256 (lowercase hex) of ``canonical_json(args)``; equals SQL ``soniq_args_hash``."""
    return hash_normalized_args(normalize_args(args))


def hash_normalized_args(args: dict[str, Any]) -> str:
    """``args_hash`` of args that already went through ``normalize_args``."""
    return hashlib.sha256(_encode(args).encode("utf-8")).hexdigest()
