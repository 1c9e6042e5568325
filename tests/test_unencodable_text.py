"""Text the database cannot store: a lone surrogate (``"q\\ud800"``) in any text input is refused
with the code that input uses for other invalid values -- never ``UnicodeEncodeError`` from the
driver, never a write (issue 26, defect 8; decision 0032).

Python strings may hold lone surrogates (``"\\ud800"``, or ``surrogateescape``'d bytes of a
command line); UTF-8 cannot encode them, so neither database can store them.
"""

import uuid
from collections.abc import Callable

import pytest
from django.core.management import CommandError, call_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soniq_django import bulk_enqueue, enqueue
from soniq_django.errors import ErrorCode, SoniqError
from soniq_django.flow import pause_queue, resume_queue
from soniq_django.models import DeadLetterJob, Job, QueueSetting
from soniq_django.owned import JobRequest, OwnedJobSource, QueueClaimFence
from soniq_django.worker import Worker
from tests.support.workers import run_burst

pytestmark = pytest.mark.django_db

BAD = "q\ud800"
WORKER = str(uuid.uuid4())
TOKEN = "t" * 32


def _fence(**changed: str) -> QueueClaimFence:
    fields = {"queue": "default", "job_id": str(uuid.uuid4()), "worker_id": WORKER,
              "generation": 1, "claim_token": TOKEN, **changed}
    return QueueClaimFence(**fields)  # type: ignore[arg-type]


#: Each text input that reaches the database: (name, how a text gets there, the code expected).
INPUTS: list[tuple[str, Callable[[str], object], ErrorCode]] = [
    # The nine calls of issue 26.
    ("enqueue queue", lambda t: enqueue("tests.add", {}, queue=t), ErrorCode.INVALID_OPTION),
    ("enqueue dedup_key", lambda t: enqueue("tests.add", {}, dedup_key=t),
     ErrorCode.INVALID_OPTION),
    ("enqueue producer_id", lambda t: enqueue("tests.add", {}, producer_id=t),
     ErrorCode.INVALID_OPTION),
    ("pause_queue", lambda t: pause_queue(t), ErrorCode.INVALID_OPTION),
    ("resume_queue", lambda t: resume_queue(t), ErrorCode.INVALID_OPTION),
    ("claim_next_owned queues", lambda t: OwnedJobSource().claim_next_owned(
        WORKER, claim_token=TOKEN, queues=["default", t]), ErrorCode.CONFIG),
    ("claim_many_owned queues", lambda t: OwnedJobSource().claim_many_owned(
        WORKER, claim_tokens=[TOKEN], queues=[t]), ErrorCode.CONFIG),
    ("complete_many_and_claim_owned queues", lambda t: OwnedJobSource()
     .complete_many_and_claim_owned([(_fence(), None)], claim_tokens=[TOKEN], queues=[t]),
     ErrorCode.CONFIG),
    ("Worker queues (soniq_worker --queues)", lambda t: Worker(queues=[t]), ErrorCode.CONFIG),
    # The other text inputs that reach the database.
    ("bulk_enqueue queue", lambda t: bulk_enqueue([JobRequest("tests.add", {}, queue=t)]),
     ErrorCode.INVALID_OPTION),
    ("pause_queue by", lambda t: pause_queue("default", by=t), ErrorCode.INVALID_OPTION),
    ("job name", lambda t: enqueue(t, {}), ErrorCode.INVALID_TASK_NAME),
    ("an args string", lambda t: enqueue("tests.add", {"a": t}), ErrorCode.TASK_ARGS_INVALID),
    ("an args key", lambda t: enqueue("tests.add", {t: 1}), ErrorCode.TASK_ARGS_INVALID),
    ("job_id text", lambda t: enqueue("tests.add", {}, job_id=t), ErrorCode.INVALID_OPTION),
    ("submission_id", lambda t: OwnedJobSource().submit_owned(
        JobRequest("tests.add", {}), submission_id=t), ErrorCode.CONFIG),
    ("submit_owned queue", lambda t: OwnedJobSource().submit_owned(
        JobRequest("tests.add", {}, queue=t), submission_id="s-1"), ErrorCode.CONFIG),
    ("active_key", lambda t: OwnedJobSource().submit_owned(
        JobRequest("tests.add", {}, active_key=t), submission_id="s-1"), ErrorCode.CONFIG),
    ("claim worker_id", lambda t: OwnedJobSource().claim_next_owned(t, claim_token=TOKEN),
     ErrorCode.CONFIG),
    ("claim token", lambda t: OwnedJobSource().claim_many_owned(
        WORKER, claim_tokens=[TOKEN, t]), ErrorCode.CONFIG),
    ("recover worker_id", lambda t: OwnedJobSource().recover_owned_claim(
        t, claim_token=TOKEN), ErrorCode.CONFIG),
    ("fence queue", lambda t: OwnedJobSource().heartbeat_owned(_fence(queue=t)),
     ErrorCode.CONFIG),
    ("fence worker_id", lambda t: OwnedJobSource().complete_owned(_fence(worker_id=t)),
     ErrorCode.CONFIG),
    ("fence claim_token", lambda t: OwnedJobSource().get_owned_state(_fence(claim_token=t)),
     ErrorCode.CONFIG),
    ("request_cancel id text", lambda t: OwnedJobSource().request_cancel(t),
     ErrorCode.INVALID_OPTION),
]


@pytest.fixture(autouse=True)
def _any_job_name(settings):
    settings.SONIQ = {"TASK_NAME_PATTERN": r"(?s).+"}  # the name check is the encodability's


def _written() -> tuple[int, int]:
    return Job.objects.count(), QueueSetting.objects.count()


@pytest.mark.parametrize("name, call, code", INPUTS, ids=[row[0] for row in INPUTS])
def test_a_lone_surrogate_is_refused_with_the_inputs_own_code(name, call, code):
    before = _written()
    with pytest.raises(SoniqError) as caught:
        call(BAD)
    assert caught.value.code is code
    assert "\ud800" not in str(caught.value)
    assert _written() == before


text = st.text(max_size=12).filter(lambda t: "\x00" not in t)
surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(row=st.sampled_from(INPUTS), before=text, lone=surrogate, after=text)
def test_any_text_with_a_lone_surrogate_in_any_input_is_refused_before_any_write(
    row, before, lone, after
):
    name, call, code = row
    counts = _written()
    try:
        call(before + lone + after)
    except SoniqError as error:  # never UnicodeEncodeError, nor a driver's error
        assert error.code is code, name
    else:
        raise AssertionError(f"{name}: accepted a lone surrogate")
    assert _written() == counts, name


# Free text soniq writes on a handler's behalf: escaped, never refused ---------------------


@pytest.mark.django_db(transaction=True)
def test_a_handlers_message_with_a_lone_surrogate_is_still_recorded(run_log):
    job_id = enqueue("tests.worker.fails_unencodable", max_attempts=1)
    assert run_burst() == 0
    letter = DeadLetterJob.objects.get(id=job_id)
    assert letter.dead_letter_reason == "max_retries_exceeded"
    assert "ValueError: cannot read name-\\udcff" in letter.last_error


@pytest.mark.parametrize("write", ["fail", "defer"])
def test_fail_and_defer_write_a_lone_surrogate_and_a_nul_as_escapes(write):
    source = OwnedJobSource()
    job_id = enqueue("tests.add", {})
    claimed = source.claim_next_owned(WORKER, claim_token=TOKEN)
    assert claimed is not None and str(claimed.job_id) == str(job_id)
    error = "bad \ud800 and \x00 text"
    if write == "fail":
        assert source.fail_owned(claimed.claim_fence, error, retry=True)
    else:
        assert source.defer_owned(claimed.claim_fence, error)
    assert Job.objects.get(id=job_id).last_error == "bad \\ud800 and \\x00 text"


@pytest.mark.parametrize("argv", [["soniq_worker", "--burst", "--queues", "a,q\udcff"],
                                  ["soniq_cancel", "--queue", "q\udcff"],
                                  ["soniq_cancel", "--name", "q\udcff"],
                                  ["soniq_queue", "pause", "q\udcff"]],
                         ids=["worker --queues", "cancel --queue", "cancel --name", "pause"])
def test_a_command_line_that_is_not_utf_8_is_refused_with_a_message(argv):
    # Bytes of argv that are not UTF-8 reach Python as lone surrogates (surrogateescape).
    before = _written()
    with pytest.raises(CommandError) as caught:
        call_command(*argv)
    assert "\udcff" not in str(caught.value)
    assert _written() == before


def test_a_handler_whose_name_holds_a_lone_surrogate_fails_the_system_checks(monkeypatch):
    # The worker publishes every handler's name in soniq_task_registry: it refuses to start.
    from soniq_django import job, registry
    from soniq_django.checks import check_settings

    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    job(name="tests.bad\ud800")(lambda: None)
    (message,) = [m for m in check_settings() if m.id == "soniq.E007"]
    assert "lone surrogate" in message.msg
