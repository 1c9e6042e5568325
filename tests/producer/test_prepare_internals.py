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


def test_a_batch_makes_its_ids_from_the_bits_uuid_would(monkeypatch):
    # The ids are built from their integers without UUID.__init__: each must be
    # the UUID that uuid.UUID(bytes=..., version=4) makes of the same 16 bytes.
    import pickle

    drawn = []

    def fixed(size):
        drawn.append(bytes((7 * n + len(drawn)) % 256 for n in range(size)))
        return drawn[-1]

    monkeypatch.setattr(request.os, "urandom", fixed)
    count = request._ID_BATCH + 3
    ids = [job.job_id for job in prepare_all(JobRequest("a.b") for _ in range(count))]
    random = b"".join(drawn)
    expected = [uuid.UUID(bytes=random[16 * n:16 * n + 16], version=4) for n in range(count)]
    assert ids == expected
    for made, standard in zip(ids, expected):
        assert (str(made), made.hex, hash(made), made.is_safe) == (
            str(standard), standard.hex, hash(standard), standard.is_safe)
        assert pickle.loads(pickle.dumps(made)) == standard


def test_job_request_init_takes_the_fields_in_order_with_their_defaults():
    # JobRequest writes its __init__ out (see its docstring): the same as the one
    # dataclass would generate from its fields.
    import dataclasses
    import inspect

    parameters = list(inspect.signature(JobRequest).parameters.values())
    fields = dataclasses.fields(JobRequest)
    assert [p.name for p in parameters] == [f.name for f in fields]
    for parameter, field in zip(parameters, fields):
        assert parameter.default == (inspect.Parameter.empty if field.default is dataclasses.MISSING
                                     else field.default), field.name
        assert (parameter.kind is inspect.Parameter.KEYWORD_ONLY) is field.kw_only, field.name
    made = JobRequest("a.b", {"x": 1}, queue="q", delay=3)
    assert dataclasses.asdict(made) == {
        f.name: {"job_name": "a.b", "args": {"x": 1}, "queue": "q", "delay": 3}.get(
            f.name, f.default) for f in fields}
    assert made == dataclasses.replace(made)
    try:
        made.queue = "other"  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("a JobRequest could be changed")


FLAT = st.dictionaries(
    st.text(max_size=6) | st.sampled_from(["a", "é", "k\x00", "i"]),
    st.none() | st.booleans() | st.integers(-(2**1001), 2**1001)
    | st.text(max_size=6) | st.sampled_from(["x\x00", "é", "\ud800"])
    | st.floats(allow_nan=True, allow_infinity=True), max_size=4)


@settings(max_examples=400)
@given(FLAT)
def test_flat_args_come_out_as_the_full_walk_makes_them(args):
    # normalize_args takes a shortcut for a flat dict of plain scalars: it must
    # accept, refuse and copy exactly as the full walk does.
    from soniq_django.encoding import _named, _normalize
    from soniq_django.errors import ConfigValidationError

    def outcome(normalize):
        try:
            return ("ok", normalize())
        except ConfigValidationError as error:
            return ("refused", error.code, str(error))

    fast = outcome(lambda: normalize_args(args))
    assert fast == outcome(lambda: _normalize(args, _named))
    if fast[0] == "ok":
        assert fast[1] is not args


def test_prepare_fills_each_field_of_the_prepared_job():
    # _prepare builds PreparedJob positionally: every field must get its own value.
    import datetime as dt

    when = dt.datetime(2030, 1, 2, tzinfo=dt.UTC)
    given_id = uuid.uuid4()
    job = request.prepare(JobRequest("a.b", {"x": 1}, queue="q", priority=7, run_at=when,
                                     max_attempts=9, unique_job=True, dedup_key="d",
                                     producer_id="p", job_id=given_id))
    assert (job.job_id, job.job_id_generated, job.job_name, job.args, job.queue, job.priority,
            job.scheduled_at, job.max_attempts, job.unique_job, job.dedup_key, job.producer_id,
            job.args_json, job.delay) == (given_id, False, "a.b", {"x": 1}, "q", 7, when, 9,
                                          True, "d", "p", '{"x":1}', None)
    assert job.args_hash == request.hash_normalized_args({"x": 1})
    later = request.prepare(JobRequest("a.b", delay=5))
    assert (later.job_id_generated, later.scheduled_at, later.delay, later.args_hash,
            later.unique_job, later.dedup_key) == (True, None, dt.timedelta(seconds=5), None,
                                                   False, None)
