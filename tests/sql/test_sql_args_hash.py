"""SQL ``soniq_args_hash`` against Python ``soniq_django.args_hash``, byte for byte.

Thousands of generated JSON objects are hashed on both sides: 1,000 mixed
objects, one per example (hypothesis spends its time generating, not
waiting for the server), and about 2,500 string-heavy ones sent in batches.
"""

import json
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soniq_django import args_hash
from soniq_django.encoding import MAX_NESTING, canonical_json
from soniq_django.errors import ErrorCode, SoniqError

from tests.support.sql import fails, fetch, value

pytestmark = [pytest.mark.postgresql_only, pytest.mark.django_db]

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "vectors" / "args_hash.json").read_text("utf-8"))


def sql_hashes(objects: list) -> list[str]:
    rows = fetch(
        "SELECT soniq_args_hash(v.value) FROM jsonb_array_elements(%s::jsonb) "
        "WITH ORDINALITY AS v(value, n) ORDER BY v.n",
        [json.dumps(objects)],
    )
    return [row[0] for row in rows]


def assert_same_hashes(objects: list):
    for obj, sql in zip(objects, sql_hashes(objects), strict=True):
        assert sql == args_hash(obj), f"canonical text on the Python side: {canonical_json(obj)!r}"


# Every code point but NUL (jsonb cannot hold it) and lone surrogates (not Unicode).
any_char = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")
tricky_char = st.sampled_from(
    [chr(c) for c in range(1, 0x20)]
    + ["\x7f", "\x80", "\x9f", "\xa0", "é", "ß", '"', "\\", "/", "'", "\u2028", "\u2029",
       "\ufeff", "\ufffd", "\uffff", "\ue000", "日", "😀", "\U0001f9ea", "\U00010000",
       "\U0010ffff", "\u0301"]
)
text = st.text(st.one_of(any_char, tricky_char), max_size=10)
keys = st.one_of(text, st.sampled_from(["", "a", "A", "b", "aa", "\uffff", "\U00010000",
                                        "\ue000", 'k"', "k\\", "k\n", "k/", "\x7f"]))

FLOAT64_OVERFLOW = 2**1024 - 2**970
numbers = st.one_of(
    st.integers(),  # small and medium
    st.integers(min_value=-(2**1000), max_value=2**1000),
    st.sampled_from([FLOAT64_OVERFLOW - 1, -(FLOAT64_OVERFLOW - 1), 2**53 + 1, -(2**63),
                     2**64, 10**300]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=True,
              min_value=-1e-300, max_value=1e-300),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.1, 1e16, 1e-7, 1.5e-7, 1e300, -1e300, 5e-324,
                     -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
                     -1.7976931348623157e308, 123456789.123456789, 1e22, 1e21, 1e-5]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, text)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=12,
)
objects = st.dictionaries(keys, json_values, max_size=6)


@pytest.mark.version_independent  # a long property run: Django 5.2 passes only
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(objects)
def test_sql_and_python_hash_generated_objects_alike(obj):
    assert_same_hashes([obj])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.dictionaries(keys, text, min_size=1, max_size=3), min_size=20, max_size=30))
def test_sql_and_python_escape_every_character_alike(batch):
    assert_same_hashes(batch)


def test_every_code_point_escapes_alike():
    # Every BMP code point but NUL and surrogates, and a sample of the astral planes.
    points = [c for c in range(1, 0x10000) if not 0xD800 <= c <= 0xDFFF]
    points += list(range(0x10000, 0x110000, 0x3FF))
    objects = [{"s": "".join(chr(c) for c in points[i:i + 512]), chr(points[i]): i}
               for i in range(0, len(points), 512)]
    assert_same_hashes(objects)


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v["args_hash"][:8])
def test_the_shared_vector(vector):
    assert canonical_json(vector["args"]) == vector["canonical"]
    assert args_hash(vector["args"]) == vector["args_hash"]
    assert value("SELECT soniq_args_hash(%s::jsonb)", [json.dumps(vector["args"])]) == (
        vector["args_hash"])


def test_key_order_is_by_code_point_at_every_level():
    ordered = {"": 0, "A": 1, "a": 2, "aa": 3, "b": 4, "\xe9": 5, "\ue000": 6, "\uffff": 7,
               "\U00010000": 8}
    shuffled = dict(reversed(list(ordered.items())))
    nested = {"z": shuffled, "a": [shuffled, {"y": shuffled}]}
    assert_same_hashes([ordered, shuffled, nested])
    assert sql_hashes([ordered]) == sql_hashes([shuffled])


def test_the_deepest_allowed_value_hashes_alike():
    deepest: object = [1e16, "\x7f", -0.0]  # level 499, holding scalars only
    for level in range(MAX_NESTING - 1, 0, -1):
        deepest = {"k\u00e9": deepest, "n": level} if level % 2 else [level, deepest]
    assert isinstance(deepest, dict)
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)  # json.dumps recurses
    try:
        assert_same_hashes([deepest])
        too_deep = {"x": [deepest]}  # 501 levels
        with pytest.raises(SoniqError) as caught:
            args_hash(too_deep)
        assert caught.value.code is ErrorCode.TASK_ARGS_INVALID
        error = fails("SELECT soniq_args_hash(%s::jsonb)", [json.dumps(too_deep)])
    finally:
        sys.setrecursionlimit(previous)
    assert (error.sqlstate, error.diag.message_hint) == ("22023", "SONIQ_TASK_ARGS_INVALID")


def _nest(depth: int) -> str:
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


@pytest.mark.parametrize(
    "text",
    ["[]", "[1]", '"s"', "1", "true", "null", '{"a": 1e400}', '{"a": [-1e400]}',
     '{"a": %d}' % FLOAT64_OVERFLOW, _nest(500), None],
    ids=["array", "array1", "string", "number", "bool", "json-null", "1e400", "-1e400",
         "overflow-int", "500-deep", "sql-null"],
)
def test_args_hash_refuses_what_enqueue_refuses(text):
    hash_error = fails("SELECT soniq_args_hash(%s::jsonb)", [text])
    enqueue_error = fails("SELECT soniq_enqueue('a.b', %s::jsonb)", [text])
    for error in (hash_error, enqueue_error):
        assert (error.sqlstate, error.diag.message_hint) == ("22023", "SONIQ_TASK_ARGS_INVALID")
    # ... and so does Python.
    with pytest.raises(SoniqError) as caught:
        args_hash(None if text is None else json.loads(text))
    assert caught.value.code is ErrorCode.TASK_ARGS_INVALID


def test_499_levels_are_hashed_and_500_refused():
    assert len(value("SELECT soniq_args_hash(%s::jsonb)", [_nest(499)])) == 64
    assert value("SELECT soniq_args_hash(%s::jsonb)", [_nest(499)]) == args_hash(
        json.loads(_nest(499)))
