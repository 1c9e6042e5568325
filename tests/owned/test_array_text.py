"""``array_text``: a PostgreSQL array literal that quotes every element exactly.

Its fast path (all text, nothing to escape) must give what the element-by-element
escape gives, for any text; and PostgreSQL must read the literal back as the list sent.
"""

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soniq_django.owned._store import _array_text, array_text

TEXT = st.text().filter(lambda t: "\x00" not in t)  # PostgreSQL's text holds no NUL
TRICKY = st.sampled_from(['"', "\\", '","', '\\"', "", " ", "{}", "NULL", "a,b", '"}', "é"])
ELEMENTS = st.lists(TEXT | TRICKY, max_size=40)
SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _reference(values):
    """Every element double-quoted, backslash and double quote escaped; numbers bare."""
    return "{" + ",".join(
        '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' if isinstance(v, str)
        else str(int(v)) for v in values) + "}"


@SETTINGS
@given(values=ELEMENTS)
def test_text_is_quoted_exactly(values):
    assert array_text(values) == _reference(values) == _array_text(values)


@SETTINGS
@given(values=st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.booleans(),
                       max_size=40))
def test_numbers_are_bare(values):
    assert array_text(values) == _reference(values)


@SETTINGS
@given(values=st.lists(TEXT | TRICKY | st.integers(min_value=0, max_value=2**40), max_size=10))
def test_a_mix_is_quoted_element_by_element(values):
    assert array_text(values) == _reference(values)


@pytest.mark.postgresql_only  # array literals are PostgreSQL's
@pytest.mark.django_db
@SETTINGS
@given(values=ELEMENTS)
def test_postgresql_reads_the_list_sent(values):
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::text[]", [array_text(values)])
        assert cursor.fetchone()[0] == values
