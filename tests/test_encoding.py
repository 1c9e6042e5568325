"""The canonical encoding and args validation, without a database."""

import datetime as dt
import json
import math
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from soniq_django import args_hash
from soniq_django.encoding import MAX_NESTING, canonical_json, normalize_args, postgres_number
from soniq_django.errors import ErrorCode, SoniqError

VECTORS = Path(__file__).resolve().parents[2] / "shared" / "vectors" / "args_hash.json"
LOCAL_VECTORS = Path(__file__).resolve().parent / "vectors" / "args_hash.json"


def _vectors():
    path = VECTORS if VECTORS.exists() else LOCAL_VECTORS
    return json.loads(path.read_text())


@pytest.mark.parametrize("vector", _vectors(), ids=lambda v: v["args_hash"][:12])
def test_shared_vector(vector):
    assert canonical_json(vector["args"]) == vector["canonical"]
    assert args_hash(vector["args"]) == vector["args_hash"]


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (1e16, "10000000000000000"),
        (1e-7, "0.0000001"),
        (-0.0, "0.0"),
        (0.0, "0.0"),
        (1.0, "1.0"),
        (1.5e-7, "0.00000015"),
        (123456789012345678.0, "123456789012345680"),
        (-2.5, "-2.5"),
        (42, "42"),
        (-(2**63), "-9223372036854775808"),
    ],
)
def test_numbers_print_as_postgres_prints_them(number, text):
    assert postgres_number(number) == text


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ('"\\', '"\\"\\\\"'),
        ("\n\r\t\b\f", '"\\n\\r\\t\\b\\f"'),
        ("\x01\x1f", '"\\u0001\\u001f"'),
        ("\x7f", '"\\u007f"'),
        ("é", '"\\u00e9"'),
        ("😀", '"\\ud83d\\ude00"'),
        ("a/b", '"a/b"'),
    ],
)
def test_strings_escape_as_json_dumps_does(text, escaped):
    assert canonical_json({"k": text}) == '{"k":' + escaped + "}"


def test_keys_sorted_at_every_level_and_stringified_like_json_dumps():
    value = {"b": {"z": 1, "a": [{"y": 2, "x": 3}]}, 10: "ten", True: "t", None: "n"}
    assert canonical_json(value) == (
        '{"10":"ten","b":{"a":[{"x":3,"y":2}],"z":1},"null":"n","true":"t"}'
    )
    assert args_hash({10: "x"}) == args_hash({"10": "x"})


def test_tuples_encode_as_arrays():
    assert canonical_json({"t": (1, 2)}) == '{"t":[1,2]}'


def _nested(levels: int) -> dict:
    """An args object that is ``levels`` deep, counting itself as level 1."""
    value: dict = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def test_nesting_499_accepted_500_rejected():
    assert normalize_args(_nested(MAX_NESTING)) == _nested(MAX_NESTING)
    with pytest.raises(SoniqError) as caught:
        normalize_args(_nested(MAX_NESTING + 1))
    assert caught.value.code is ErrorCode.TASK_ARGS_INVALID


def test_hostile_depth_and_cycles_are_refused_not_crashing():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(SoniqError):
        normalize_args({"x": deep})
    cyclic: dict = {}
    cyclic["self"] = cyclic
    with pytest.raises(SoniqError):
        normalize_args(cyclic)


class Opaque:
    pass


@pytest.mark.parametrize(
    "bad",
    [
        {"when": dt.datetime(2024, 1, 1, tzinfo=dt.UTC)},
        {"day": dt.date(2024, 1, 1)},
        {"amount": Decimal("1.5")},
        {"tags": {"a", "b"}},
        {"blob": b"bytes"},
        {"x": math.nan},
        {"x": math.inf},
        {"x": -math.inf},
        {"x": 10**400},
        {"x": "nul\x00char"},
        {"nul\x00key": 1},
        {"x": "\ud800"},
        {"x": Opaque()},
        {(1, 2): "tuple key"},
        {1: "a", "1": "b"},
    ],
    ids=lambda v: type(next(iter(v.values()))).__name__,
)
def test_rejects_what_is_not_standard_finite_json(bad):
    with pytest.raises(SoniqError) as caught:
        normalize_args(bad)
    assert caught.value.code is ErrorCode.TASK_ARGS_INVALID


@pytest.mark.parametrize("bad", [None, [], "text", 1, [("a", 1)]])
def test_args_must_be_an_object(bad):
    with pytest.raises(SoniqError) as caught:
        normalize_args(bad)
    assert caught.value.code is ErrorCode.TASK_ARGS_INVALID


def test_error_messages_never_echo_the_payload():
    secret = "hunter2-secret-value"
    for bad in ({"pw": secret, "x": math.nan}, {secret: Opaque()}, {"pw": secret + "\x00"}):
        with pytest.raises(SoniqError) as caught:
            normalize_args(bad)
        assert secret not in str(caught.value)
        assert secret not in repr(caught.value)


def test_normalize_copies_so_later_mutation_changes_nothing():
    original = {"items": [{"n": 1}]}
    copy = normalize_args(original)
    original["items"][0]["n"] = 2
    assert copy == {"items": [{"n": 1}]}


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8).filter(lambda k: "\x00" not in k), children, max_size=4),
    max_leaves=20,
)
json_objects = st.dictionaries(
    st.text(max_size=8).filter(lambda k: "\x00" not in k), json_values, max_size=5
)


@given(json_objects)
def test_canonical_json_is_ascii_json_that_round_trips(value):
    text = canonical_json(value)
    assert text.isascii()
    # The same data comes back, numbers compared as exact decimals.
    exact = {"parse_float": Decimal, "parse_int": Decimal}
    assert json.loads(text, **exact) == json.loads(json.dumps(value), **exact)


@given(json_objects)
def test_canonical_json_equals_sorted_compact_json_dumps_for_integers_and_strings(value):
    def has_float(v):
        if isinstance(v, float):
            return True
        if isinstance(v, dict):
            return any(has_float(x) for x in v.values())
        if isinstance(v, list):
            return any(has_float(x) for x in v)
        return False

    if not has_float(value):
        assert canonical_json(value) == json.dumps(value, sort_keys=True, separators=(",", ":"))
