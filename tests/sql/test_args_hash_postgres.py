"""Python's canonical encoding against PostgreSQL's own jsonb rendering.

PostgreSQL is the reference for numbers: format 1 says they are written the
way ``jsonb`` prints them back. Each generated value is stored as jsonb,
printed by the server, and re-encoded with the server's number text kept
verbatim; the result must equal ``canonical_json`` byte for byte.
"""

import json
import sys

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from json.encoder import encode_basestring_ascii

from soniq_django.encoding import MAX_NESTING, canonical_json, postgres_number

pytestmark = [pytest.mark.postgresql_only, pytest.mark.django_db]


class _Number(str):
    """A number literal exactly as the server printed it."""


def _reencode(value) -> str:
    if isinstance(value, _Number):
        return str(value)
    # Lists, not generators, go to join(): on Python 3.12 a generator's
    # recursion passes through C (join) at every level, and the C stack limit
    # (which sys.setrecursionlimit does not raise) stops it short of MAX_NESTING.
    if isinstance(value, dict):
        items = sorted(value.items())
        members = [encode_basestring_ascii(k) + ":" + _reencode(v) for k, v in items]
        return "{" + ",".join(members) + "}"
    if isinstance(value, list):
        return "[" + ",".join([_reencode(v) for v in value]) + "]"
    if isinstance(value, str):
        return encode_basestring_ascii(value)
    return json.dumps(value)  # true, false, null


def _postgres_canonical(value) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT (%s::jsonb)::text", [json.dumps(value)])
        (rendered,) = cursor.fetchone()
    parsed = json.loads(rendered, parse_float=_Number, parse_int=_Number)
    return _reencode(parsed)


text_values = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=12,
)
interesting_text = st.sampled_from(
    ["\x7f", "\x01", "\x1f", "\n\r\t\b\f", '"\\/', "é", "😀", "\u2028", "\ufeff", "日本"]
)
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e16, 1e-7, -0.0, 0.0, 1e300, 5e-324, 1.7976931348623157e308, 0.1, 1.5e-7]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, text_values, interesting_text)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(text_values | interesting_text, children, max_size=4),
    max_leaves=25,
)
objects = st.dictionaries(text_values | interesting_text, values, max_size=6)


@pytest.mark.version_independent  # a long property run: Django 5.2 passes only
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(objects)
def test_canonical_json_matches_postgres_rendering(value):
    assert canonical_json(value) == _postgres_canonical(value)


@pytest.mark.version_independent  # a long property run: Django 5.2 passes only
@settings(max_examples=1500, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_float_prints_as_postgres_prints_it(number):
    with connection.cursor() as cursor:
        cursor.execute("SELECT (%s::jsonb)::text", [json.dumps(number)])
        assert cursor.fetchone()[0] == postgres_number(number)


def test_deepest_allowed_nesting_matches():
    # The test's own re-encoder recurses; canonical_json does not.
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)
    try:
        value: dict = {"leaf": 1.5e-7}
        for _ in range(MAX_NESTING - 1):
            value = {"a": value}
        assert canonical_json(value) == _postgres_canonical(value)
    finally:
        sys.setrecursionlimit(previous)
