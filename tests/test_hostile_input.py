"""Hostile input: whatever a caller sends either round-trips exactly or is
refused with a documented code -- never a partial row, a crash or an echo.
"""

import json
import math
import uuid
from decimal import Decimal

import pytest
from django.db import connection
from django.db import Error as DatabaseError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soniq_django import enqueue, get_job
from soniq_django.errors import ConfigValidationError, ErrorCode, SoniqError
from soniq_django.producer.request import JobRequest
from soniq_django.models import Job
from soniq_django.owned import OwnedJobSource

pytestmark = pytest.mark.django_db

ARGS_CODES = {ErrorCode.TASK_ARGS_INVALID}
SQLISH = st.sampled_from([
    "'; DROP TABLE soniq_jobs; --", "\" OR 1=1 --", "$$; SELECT 1; $$", "\\x00", "%s%s%s",
    "{}", "NULL", "billing.send_invoice'--", "\u202e\u0000" [:1], "é" * 300, "\U0001F600" * 3,
])
anything = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | SQLISH
    | st.binary(max_size=4) | st.sampled_from([math.nan, math.inf, 10**400, -(10**400)]),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=5) | st.integers(), children, max_size=3)
    | st.tuples(children, children),
    max_leaves=12,
)
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def _exact(value):
    return json.loads(json.dumps(value), parse_float=Decimal, parse_int=Decimal)


def _count() -> int:
    return Job.objects.count()


@SETTINGS
@given(args=st.dictionaries(st.text(max_size=8) | SQLISH, anything, max_size=4))
def test_python_enqueue_round_trips_or_refuses(args):
    before = _count()
    secret_bits = [v for v in args.values() if isinstance(v, str) and len(v) > 6]
    try:
        job_id = enqueue("hostile.job", args)
    except SoniqError as error:
        assert error.code in ARGS_CODES
        assert _count() == before
        for bit in secret_bits:
            assert bit not in str(error)
        return
    stored = Job.objects.get(id=job_id).args
    # Numbers compare as exact decimals: jsonb prints 1e16 as 10000000000000000,
    # which Python reads back as an int of the same value (docs/storage-format.md).
    assert _exact(stored) == _exact(args)
    Job.objects.filter(id=job_id).delete()


@SETTINGS
@given(
    name=st.text(max_size=40) | SQLISH,
    queue=st.none() | st.text(max_size=300) | SQLISH,
    dedup=st.none() | st.text(max_size=300) | SQLISH,
    producer=st.none() | st.text(max_size=300) | SQLISH,
    priority=st.none() | st.integers() | st.booleans() | st.floats(),
    attempts=st.none() | st.integers() | st.booleans(),
)
def test_every_text_parameter_is_data_never_sql(name, queue, dedup, producer, priority, attempts):
    before = _count()
    try:
        job_id = enqueue(name, {"x": 1}, queue=queue, dedup_key=dedup, producer_id=producer,
                         priority=priority, max_attempts=attempts)
    except SoniqError as error:
        assert error.code in {ErrorCode.INVALID_TASK_NAME, ErrorCode.INVALID_OPTION,
                              ErrorCode.INVALID_MAX_ATTEMPTS}
        assert _count() == before
        return
    row = Job.objects.get(id=job_id)
    assert row.job_name == name
    if queue is not None:
        assert row.queue == queue
    if dedup is not None:
        assert row.dedup_key == dedup
    Job.objects.filter(id=job_id).delete()


@pytest.mark.postgresql_only
@SETTINGS
@given(args=st.text(max_size=60).filter(lambda t: "\x00" not in t) | SQLISH | st.sampled_from(
    ['{"a": 1e400}', '[1]', '{"a": "\\u0000"}', '{"a": ' * 40 + "1" + "}" * 40, "null",
     '{"a": NaN}', '{"a": "x"}', '{"\\ud800": 1}']))
def test_sql_enqueue_refuses_with_a_documented_sqlstate(args):
    before = _count()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SAVEPOINT hostile")
            cursor.execute("SELECT soniq_enqueue('hostile.sql', %s::jsonb)", [args])
            (job_id,) = cursor.fetchone()
            cursor.execute("RELEASE SAVEPOINT hostile")
    except DatabaseError as error:
        with connection.cursor() as cursor:
            cursor.execute("ROLLBACK TO SAVEPOINT hostile")
        cause = error.__cause__
        assert cause.sqlstate in {"22023", "22P02", "22P05", "22P04", "54001"}, cause.sqlstate
        if cause.sqlstate == "22023":
            assert cause.diag.message_hint == "SONIQ_TASK_ARGS_INVALID"
        assert _count() == before
        return
    assert get_job(job_id).job_name == "hostile.sql"
    assert _exact(json.loads(args)) == _exact(Job.objects.get(id=job_id).args)


@SETTINGS
@given(
    submission_id=st.text(min_size=0, max_size=300) | st.integers() | st.none(),
    worker=st.text(min_size=0, max_size=300) | st.none(),
    token=st.text(min_size=0, max_size=300),
)
def test_owned_identities_are_bounded_exact_strings(submission_id, worker, token):
    source = OwnedJobSource()
    before = _count()
    valid_submission = (isinstance(submission_id, str) and 0 < len(submission_id) <= 255
                        and "\x00" not in submission_id)
    try:
        job_id = source.submit_owned(JobRequest("hostile.owned", {}), submission_id=submission_id)
    except ConfigValidationError as error:
        assert not valid_submission and error.code is ErrorCode.CONFIG
        assert _count() == before
    else:
        assert valid_submission
        assert Job.objects.get(id=job_id).submission_id == submission_id
    valid_claim = all(isinstance(v, str) and 0 < len(v) <= 255 and "\x00" not in v
                      for v in (worker, token))
    try:
        claimed = source.claim_next_owned(worker, claim_token=token)
    except ConfigValidationError:
        assert not valid_claim
        return
    except SoniqError as error:  # a token hypothesis happened to repeat
        assert error.code is ErrorCode.QUEUE_CLAIM_CONFLICT
        return
    assert valid_claim
    if claimed is not None:
        assert (claimed.claim_fence.worker_id, claimed.claim_fence.claim_token) == (worker, token)
        assert str(uuid.UUID(claimed.claim_fence.job_id)) == claimed.claim_fence.job_id
