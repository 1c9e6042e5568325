"""A job's timeline on its admin page, from what its rows already record.

soniq keeps no history table: a job's row holds its latest state, and each
claim, failure and completion overwrites what the one before wrote. So the
timeline shows what the columns can still tell, and says plainly where a
step happened but its details were not kept (docs/admin.md, "Timeline"):

- enqueued: ``created_at`` (for a replayed job, the first enqueue's time);
- each claim: only the latest keeps its worker (``claim_owner``,
  ``worker_id``) and ``claim_generation``; how many came before is known
  (the generation counts claims, the attempts count those that ran), not
  their workers or times. No claim's time is recorded: ``updated_at`` is the
  last write, which a heartbeat moves on;
- each failure: only the latest error (``last_error``); the retry's due
  time (``scheduled_at``) and when it was written (``updated_at``);
- completion or cancel: ``updated_at``, and ``expires_at`` for how long the
  row stays;
- dead-lettering and replays, from the dead letter: the latest move
  (``moved_to_dead_letter_at``, its reason), the number of replays and the
  latest one's time.
"""

import datetime as dt
from dataclasses import dataclass

from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from ..models import DeadLetterJob, Job, JobStatus
from ..replay import GENERATION_STRIDE
from .display import plural, when

_SUMMARY_CHARACTERS = 300


@dataclass(frozen=True)
class Event:
    """One step of a job's life: when (None: not recorded), what, and what else is known."""

    at: dt.datetime | None
    what: str
    detail: str = ""


def error_summary(error: str | None) -> str:
    """An error's last non-empty line (a traceback's exception), cut to a readable length."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    if not lines:
        return ""
    last = lines[-1]
    return last if len(last) <= _SUMMARY_CHARACTERS else f"{last[:_SUMMARY_CHARACTERS]}…"


def _time(value: dt.datetime | None) -> str:
    return "-" if value is None else timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S")


def _claims(job: Job, dead: DeadLetterJob | None) -> tuple[int, int]:
    """(claims in this incarnation, the generation it started from)."""
    incarnation = dead.resurrection_count if dead is not None else (
        job.claim_generation // GENERATION_STRIDE)
    base = incarnation * GENERATION_STRIDE
    return max(job.claim_generation - base, 0), base


def _replays(dead: DeadLetterJob) -> list[Event]:
    """The dead letter's record of the job's earlier runs, as a replayed job's page shows it."""
    events = [Event(dead.moved_to_dead_letter_at, f"Dead-lettered ({dead.dead_letter_reason})",
                    f"after {plural(dead.attempts, 'attempt')}"
                    + ("; only the latest move to the dead letters is recorded"
                       if dead.resurrection_count > 1 else ""))]
    if dead.last_resurrection_at is not None:
        events.append(Event(dead.last_resurrection_at, "Replayed from the dead letters",
                            f"replay {dead.resurrection_count}; attempts start again at 0"))
    return events


def job_events(job: Job, dead: DeadLetterJob | None = None) -> list[Event]:
    """The steps of ``job`` its row (and its dead letter's, if it has one) can still tell."""
    events = [Event(job.created_at, "Enqueued", f"queue {job.queue}, priority {job.priority}"
                    + (f", by producer {job.producer_id}" if job.producer_id else ""))]
    if dead is not None and dead.resurrection_count:
        events += _replays(dead)
    claims, base = _claims(job, dead)
    if claims > 1:
        events.append(Event(None, f"{plural(claims - 1, 'earlier claim')}",
                            f"generations {base + 1} to {job.claim_generation - 1}; their "
                            "workers, times and errors are not recorded (each claim "
                            "overwrites the one before)"))
    if claims or job.attempts:
        owner = job.claim_owner or (str(job.worker_id) if job.worker_id else "not recorded")
        events.append(Event(None, f"Claimed: attempt {job.attempts}",
                            f"worker {owner}, generation {job.claim_generation}; the time of a "
                            "claim is not recorded"))
    events += _outcome(job)
    return events


def _outcome(job: Job) -> list[Event]:
    """What the row says happened last, or is happening now."""
    error = error_summary(job.last_error)
    if job.status == JobStatus.PROCESSING:
        return [Event(job.updated_at, "Running", "last written (claim or heartbeat); lease until "
                      + _time(job.lease_expires_at)
                      + ("; cancel requested" if job.cancel_requested else ""))]
    if job.status == JobStatus.QUEUED:
        if job.attempts and job.last_error:
            return [Event(job.updated_at, f"Attempt {job.attempts} failed", error),
                    Event(job.scheduled_at, "Due again (retry)")]
        if job.scheduled_at is not None and job.scheduled_at > job.created_at:
            return [Event(job.scheduled_at, "Due", "waiting for its run_at")]
        return [Event(None, "Waiting to be claimed")]
    events = []
    if job.status == JobStatus.DONE:
        if job.last_error:
            events.append(Event(None, "An earlier attempt failed", error))
        events.append(Event(job.updated_at, "Completed", f"attempt {job.attempts}"))
    else:
        events.append(Event(job.updated_at, "Cancelled", error))
    if job.expires_at is not None:
        events.append(Event(job.expires_at, "Row expires", "housekeeping deletes it after this"))
    return events


def dead_letter_events(dead: DeadLetterJob, job_is_live: bool) -> list[Event]:
    """The steps of a dead-lettered job its dead-letter row can still tell."""
    events = [Event(dead.original_created_at, "Enqueued", f"queue {dead.queue}")]
    replayed_since = (dead.last_resurrection_at is not None
                      and dead.last_resurrection_at >= dead.moved_to_dead_letter_at)
    earlier = dead.resurrection_count - (1 if replayed_since else 0)
    if earlier:
        events.append(Event(None, f"{plural(earlier, 'earlier replay')}",
                            "each a new run; only the latest dead-lettering is recorded"))
    events.append(Event(None, plural(dead.attempts, "attempt"),
                        "the dead-letter row keeps no worker, generation or claim time"))
    events.append(Event(dead.moved_to_dead_letter_at,
                        f"Dead-lettered ({dead.dead_letter_reason})",
                        error_summary(dead.last_error)))
    if replayed_since:
        events.append(Event(dead.last_resurrection_at, "Replayed into the queue",
                            "the job's page has what happened since" if job_is_live else
                            "no longer in soniq_jobs: it finished and its row expired"))
    return events


def render_timeline(events: list[Event], job_url: str | None = None) -> str:
    """The events as a small table (escaped), with a link to the job's own page if given."""
    rows = format_html_join(
        "\n", "<tr><td>{}</td><th scope=\"row\">{}</th><td>{}</td></tr>",
        ((when(event.at) if event.at else format_html('<span class="quiet">{}</span>',
                                                       "not recorded"),
          event.what, event.detail) for event in events))
    link = format_html(' <a href="{}">The job\'s timeline since its replay.</a>', job_url) \
        if job_url else ""
    return format_html(
        '<table class="soniq-timeline"><thead><tr><th scope="col">When</th>'
        '<th scope="col">Event</th><th scope="col">Details</th></tr></thead>'
        "<tbody>{}</tbody></table><p class=\"help\">From the job's rows as they are now; "
        "soniq keeps no history table, so each claim and failure overwrites the one "
        "before.{}</p>", rows, link)


def job_url(job_id: object) -> str:
    return reverse("admin:soniq_django_job_change", args=[job_id])
