"""A job's timeline on its admin page: its rows and its recorded attempts.

What it shows (docs/admin.md, "A job's timeline"):

- enqueued: ``created_at`` (for a replayed job, the first enqueue's time);
- each attempt, oldest first (soniq_django.attempts): when it was claimed,
  by which worker, how long it ran, how it ended (failed and retried,
  lease lapsed, deferred, dead-lettered, done, cancelled) and its error.
  Attempts that ended without finishing the job are rows of
  ``soniq_job_attempts``; the running or last one is the job's own row.
  A claim made before migration 0020 (or by a program that does not record
  it) has no claim time: the page says so;
- what the job waits for now: its retry's due time, or its ``run_at``;
- dead-lettering and replays, from the dead letter;
- when a finished row expires (``expires_at``).
"""

import dataclasses
import datetime as dt
from dataclasses import dataclass

from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from ..attempts import Attempt, job_attempts
from ..models import AttemptOutcome, DeadLetterJob, Job, JobStatus
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


def _replays(dead: DeadLetterJob) -> list[Event]:
    """The dead letter's record of the job's earlier runs, as a replayed job's page shows it."""
    events = [Event(dead.moved_to_dead_letter_at, f"Dead-lettered ({dead.dead_letter_reason})",
                    f"after {plural(dead.attempts, 'attempt')}"
                    + ("; only the latest move to the dead letters is kept on the dead letter"
                       if dead.resurrection_count > 1 else ""))]
    if dead.last_resurrection_at is not None:
        events.append(Event(dead.last_resurrection_at, "Replayed from the dead letters",
                            f"replay {dead.resurrection_count}; attempts start again at 0"))
    return events


_ENDINGS = {**dict(AttemptOutcome.choices), "running": "running", "done": "completed",
            "cancelled": "cancelled", "moved": "ended, the job left the queue"}


def _seconds(delta: dt.timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def worker_link(worker_id: object, owner: str | None) -> str:
    """The worker's admin page (its id shortened), or the claim's owner as text."""
    if worker_id is not None:
        try:
            url = reverse("admin:soniq_django_worker_change", args=[worker_id])
        except NoReverseMatch:  # the worker admin is unregistered
            return str(worker_id)
        return format_html('<a href="{}" title="{}">worker {}</a>', url, worker_id,
                           str(worker_id)[:8])
    return f"owner {owner}" if owner else "worker not recorded"


def attempt_event(attempt: Attempt, now: dt.datetime, job: Job | None = None) -> Event:
    """One attempt as a timeline row: claimed when, by whom, for how long, how it ended."""
    what = f"Attempt {attempt.attempt}: {_ENDINGS.get(attempt.outcome, attempt.outcome)}"
    if attempt.dead_letter_reason:
        what += f" ({attempt.dead_letter_reason})"
    parts = [worker_link(attempt.worker_id, attempt.claim_owner)]
    ran = attempt.ran_for(now)
    if ran is not None:
        parts.append(("running for " if attempt.ended_at is None else "ran ") + _seconds(ran))
    elif attempt.claimed_at is None:
        parts.append("claim time not recorded")
    if attempt.ended_at is not None:
        parts.append(f"ended {_time(attempt.ended_at)}")
    if attempt.outcome == "running" and job is not None:
        parts.append("lease until " + _time(job.lease_expires_at))
        if job.cancel_requested:
            parts.append("cancel requested")
    if attempt.outcome == "lapsed":
        parts.append("its worker stopped renewing the lease; the job was run again")
    if attempt.outcome == "deferred":
        parts.append("given back without counting an attempt")
    error = error_summary(attempt.error)
    if error:
        parts.append(error)
    detail = format_html_join("; ", "{}", ((part,) for part in parts))
    return Event(attempt.claimed_at or attempt.ended_at, what, detail)


def job_events(job: Job, dead: DeadLetterJob | None = None,
               now: dt.datetime | None = None, *, dead_letters: bool = True) -> list[Event]:
    """The steps of ``job``: enqueue, each attempt (and replays between), what it waits for.

    ``dead_letters=False`` (a user the dead-letter admin refuses) shows an
    attempt that ended in the dead letters without its reason or error.
    """
    now = now or timezone.now()
    attempts = [attempt if dead_letters or attempt.outcome != "dead" else dataclasses.replace(
        attempt, outcome="moved", dead_letter_reason=None, error=None)
        for attempt in job_attempts(job)]
    steps = [attempt_event(attempt, now, job) for attempt in attempts]
    if dead is not None and dead.resurrection_count:
        # The replay went between the attempts that ended before it and those after.
        replayed = dead.last_resurrection_at
        before = sum(1 for attempt in attempts if replayed is None or (
            attempt.ended_at is not None and attempt.ended_at <= replayed))
        told = before and attempts[before - 1].outcome in ("dead", "moved")
        steps[before:before] = _replays(dead)[1:] if told else _replays(dead)
    if not attempts and job.attempts:
        steps.append(Event(None, plural(job.attempts, "earlier attempt"),
                           "made before attempts were recorded (migration 0020)"))
    ended_by_an_attempt = bool(attempts) and attempts[-1].outcome in ("done", "cancelled")
    return [Event(job.created_at, "Enqueued", f"queue {job.queue}, priority {job.priority}"
                  + (f", by producer {job.producer_id}" if job.producer_id else "")),
            *steps, *_now(job, ended_by_an_attempt)]


def _now(job: Job, ended_by_an_attempt: bool) -> list[Event]:
    """What the job waits for, or how it ended outside an attempt, and when its row goes."""
    if job.status == JobStatus.QUEUED:
        if job.attempts and job.last_error:
            return [Event(job.scheduled_at, "Due again (retry)",
                          f"after attempt {job.attempts}")]
        if job.scheduled_at is not None and job.scheduled_at > job.created_at:
            return [Event(job.scheduled_at, "Due", "waiting for its run_at")]
        return [Event(None, "Waiting to be claimed")]
    events = []
    if job.status == JobStatus.CANCELLED and not ended_by_an_attempt:
        events.append(Event(job.updated_at, "Cancelled", error_summary(job.last_error)))
    if job.status in (JobStatus.DONE, JobStatus.CANCELLED) and job.expires_at is not None:
        events.append(Event(job.expires_at, "Row expires", "housekeeping deletes it after this"))
    return events


def dead_letter_events(dead: DeadLetterJob, job_is_live: bool,
                       now: dt.datetime | None = None) -> list[Event]:
    """The steps of a dead-lettered job: enqueue, its recorded attempts, the move, replays."""
    now = now or timezone.now()
    events = [Event(dead.original_created_at, "Enqueued", f"queue {dead.queue}")]
    replayed_since = (dead.last_resurrection_at is not None
                      and dead.last_resurrection_at >= dead.moved_to_dead_letter_at)
    attempts = [attempt for attempt in job_attempts(dead)
                if attempt.ended_at is None or attempt.ended_at <= dead.moved_to_dead_letter_at]
    earlier = dead.resurrection_count - (1 if replayed_since else 0)
    if earlier:
        events.append(Event(None, f"{plural(earlier, 'earlier replay')}",
                            "each a new run; only the latest dead-lettering is on this row"))
    events += [attempt_event(attempt, now) for attempt in attempts]
    if not attempts:
        events.append(Event(None, plural(dead.attempts, "attempt"),
                            "made before attempts were recorded (migration 0020)"))
    if not attempts or attempts[-1].outcome != "dead":
        events.append(Event(dead.moved_to_dead_letter_at,
                            f"Dead-lettered ({dead.dead_letter_reason})",
                            f"after {plural(dead.attempts, 'attempt')}; "
                            + error_summary(dead.last_error)))
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
        "<tbody>{}</tbody></table><p class=\"help\">Each attempt that ended without "
        "finishing the job is recorded (the newest 100); the running or last one is the "
        "job's own row.{}</p>", rows, link)


def job_url(job_id: object) -> str:
    return reverse("admin:soniq_django_job_change", args=[job_id])
