"""A job's place in a workflow, as its admin page shows it (docs/admin.md, docs/workflows.md).

Its dependencies and dependents (each linked, with its state now and the
edge's), how many it still waits for, and for a batch member or callback the
batch's progress -- members done, failed (dead-lettered or cancelled),
pending, purged -- with links to every member and the callback. Everything is
escaped (``format_html``; job names through ``visible``). A linked job that is
a dead letter links to its dead-letter page only when the user may view dead
letters (otherwise it shows as having left the queue, as the timeline does
for such a user, and is counted so), and a job in soniq_jobs to its page
only when the user may view jobs; otherwise its id is shown as text.
"""

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.urls import reverse
from django.utils.html import format_html, format_html_join

from ..models import Batch, BatchMember, DeadLetterJob, Job, JobStatus
from ..workflows import dependencies_of, dependents_of, waiting
from .display import plural, visible

#: Members listed on a batch's page at most (the counts cover them all).
MEMBERS_SHOWN = 100


@dataclass(frozen=True)
class Links:
    """Which admin pages a link may point to, for this user."""

    jobs: bool
    dead_letters: bool


@dataclass(frozen=True)
class _Found:
    state: str  # a job status, "dead_letter", or "purged"
    job_name: str | None


def _find(ids: Iterable[uuid.UUID], using: str, links: Links) -> dict[uuid.UUID, _Found]:
    """Each job's state: its status, "dead_letter" (or, for a user who may not view dead
    letters, "left": it left the queue), or "purged"."""
    wanted = list(dict.fromkeys(ids))
    found = {row[0]: _Found(row[1], row[2]) for row in Job.objects.using(using).filter(
        id__in=wanted).values_list("id", "status", "job_name")}
    missing = [i for i in wanted if i not in found]
    if missing:
        dead = "dead_letter" if links.dead_letters else "left"
        found.update((row[0], _Found(dead, row[1])) for row in
                     DeadLetterJob.objects.using(using).filter(id__in=missing)
                     .values_list("id", "job_name"))
    return {i: found.get(i, _Found("purged", None)) for i in wanted}


def _link(job_id: uuid.UUID, found: _Found, links: Links) -> str:
    short = str(job_id)[:8]
    url = None
    if found.state == "dead_letter" and links.dead_letters:
        url = reverse("admin:soniq_django_deadletterjob_change", args=[job_id])
    elif found.state not in ("dead_letter", "left", "purged") and links.jobs:
        url = reverse("admin:soniq_django_job_change", args=[job_id])
    label = format_html('<code title="{}">{}</code>', str(job_id), short)
    name = format_html(" {}", visible(found.job_name)) if found.job_name else ""
    if url is None:
        return format_html("{}{}", label, name)
    return format_html('<a href="{}">{}</a>{}', url, label, name)


def _state_text(found: _Found) -> str:
    return {"dead_letter": "dead-lettered", "left": "left the queue",
            "purged": "purged"}.get(found.state, found.state)


def _edges(rows: list[tuple[uuid.UUID, str, bool]], using: str, links: Links) -> str:
    found = _find((row[0] for row in rows), using, links)
    return format_html_join(
        "\n", '<li>{} - <span class="soniq-state-{}">{}</span>{}</li>',
        ((_link(other, found[other], links), found[other].state, _state_text(found[other]),
          format_html(" (edge {}{})", state, ", any outcome" if any_outcome else ""))
         for other, state, any_outcome in rows))


def _batch_of(job_id: uuid.UUID, using: str) -> Batch | None:
    found = Batch.objects.using(using).filter(callback_id=job_id).first()
    if found is None:
        batch_id = BatchMember.objects.using(using).filter(job_id=job_id).values_list(
            "batch_id", flat=True).first()
        if batch_id is not None:
            found = Batch.objects.using(using).filter(id=batch_id).first()
    return found


def _batch(batch: Batch, using: str, links: Links) -> str:
    members = list(BatchMember.objects.using(using).filter(batch_id=batch.id)
                   .order_by("position").values_list("job_id", flat=True))
    found = _find(members, using, links)
    done = sum(1 for f in found.values() if f.state == JobStatus.DONE)
    failed = sum(1 for f in found.values()
                 if f.state in (JobStatus.CANCELLED, "dead_letter"))
    left = sum(1 for f in found.values() if f.state == "left")
    purged = sum(1 for f in found.values() if f.state == "purged")
    pending = len(members) - done - failed - left - purged
    counts = format_html("{} done, {} failed, {} pending{}{}", done, failed, pending,
                         format_html(", {} left the queue", left) if left else "",
                         format_html(", {} purged", purged) if purged else "")
    shown = format_html_join(
        "\n", '<li>{} - <span class="soniq-state-{}">{}</span></li>',
        ((_link(member, found[member], links), found[member].state,
          _state_text(found[member])) for member in members[:MEMBERS_SHOWN]))
    more = (format_html("<li>and {} more</li>", len(members) - MEMBERS_SHOWN)
            if len(members) > MEMBERS_SHOWN else "")
    if batch.callback_id is None:
        callback = "none"
    else:
        callback_found = _find([batch.callback_id], using, links)[batch.callback_id]
        callback = format_html("{} - {}", _link(batch.callback_id, callback_found, links),
                               _state_text(callback_found))
    return format_html(
        '<p>Batch <code>{}</code>, {}: {}.</p><p>Callback: {}</p><ol>{}{}</ol>',
        str(batch.id), plural(batch.size, "member"), counts, callback, shown, more)


def render_workflow(job_id: uuid.UUID, using: str, links: Links) -> str:
    """The workflow section of job ``job_id``'s page ("-" when it is in none)."""
    depends = dependencies_of(job_id, using)
    dependents = dependents_of(job_id, using)
    pending = waiting(job_id, using)
    batch = _batch_of(job_id, using)
    if not depends and not dependents and batch is None:
        return "-"
    parts: list[Any] = []
    if depends:
        waits = format_html(" (waits for {} more)", pending) if pending else ""
        parts.append(format_html("<p>Depends on{}:</p><ul>{}</ul>", waits,
                                 _edges(depends, using, links)))
    if dependents:
        parts.append(format_html("<p>Dependents:</p><ul>{}</ul>",
                                 _edges(dependents, using, links)))
    if batch is not None:
        parts.append(_batch(batch, using, links))
    return format_html_join("\n", "{}", ((part,) for part in parts))
