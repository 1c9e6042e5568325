"""prepare()'s own helpers: the args encoder made once, and the batch id source (no database)."""

import json
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from soniq_django.encoding import normalize_args
from soniq_django.producer import request
from soniq_django.producer.request import JobRequest, encode_args, prepare_all

STANDARD = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode

TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               max_size=8)
ARGS = st.dictionaries(TEXT, st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | TEXT
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=12), max_size=4)


@settings(max_examples=300)
@given(ARGS)
def test_encode_args_writes_what_the_standard_encoder_writes(args):
    normalized = normalize_args(args)
    assert encode_args(normalized) == STANDARD(normalized)


def test_a_batch_draws_fresh_version_4_ids(monkeypatch):
    draws = []
    urandom = request.os.urandom

    def counted(size):
        draws.append(size)
        return urandom(size)

    monkeypatch.setattr(request.os, "urandom", counted)
    count = 3 * request._ID_BATCH + 1
    ids = [job.job_id for job in prepare_all(JobRequest("a.b") for _ in range(count))]
    assert len(set(ids)) == count
    assert all(isinstance(i, uuid.UUID) and i.version == 4 and i.variant == uuid.RFC_4122
               for i in ids)
    assert draws == [16 * request._ID_BATCH] * 4
    given_id = uuid.uuid4()
    (job,) = prepare_all([JobRequest("a.b", job_id=given_id)])
    assert job.job_id == given_id and not job.job_id_generated


def test_a_batch_checks_each_new_name_and_every_name_that_is_not_text():
    from soniq_django.errors import ConfigValidationError, ErrorCode

    for bad in ("Bad.name", "a.b\n", 7, None):
        try:
            prepare_all([JobRequest("a.b"), JobRequest("a.b"), JobRequest(bad)])
        except ConfigValidationError as error:
            assert error.code is ErrorCode.INVALID_TASK_NAME
        else:
            raise AssertionError(f"{bad!r} was accepted")
