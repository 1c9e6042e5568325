"""A job's durable steps, as its admin page shows them (docs/admin.md, docs/steps.md).

One row per recorded step, in the order they were recorded: its name
(escaped, through ``visible``), when it was recorded, by which attempt, and
its result's size. Never the result itself: a step's result may be anything
the handler computed, and the page is for operators. At most ``STEPS_SHOWN``
rows; the rest are counted.
"""

import uuid

from django.utils.html import format_html, format_html_join

from ..steps import count_steps, recorded_steps
from .display import visible, when

#: Steps listed on a job's page at most (the count covers them all).
STEPS_SHOWN = 200


def _size(size: int) -> str:
    return f"{size:,} B" if size < 10_000 else f"{size / 1024:,.1f} KiB"


def render_steps(job_id: uuid.UUID, using: str) -> str:
    """The job's recorded steps as an HTML table, or "-" when it has none."""
    steps = recorded_steps(job_id, using, limit=STEPS_SHOWN)  # a job may record thousands
    if not steps:
        return "-"
    rows = format_html_join(
        "\n", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        ((visible(s.name), when(s.recorded_at), s.attempt, _size(s.size)) for s in steps))
    total = count_steps(job_id, using) if len(steps) == STEPS_SHOWN else len(steps)
    more = format_html("<p>and {} more</p>", total - STEPS_SHOWN) if total > STEPS_SHOWN else ""
    return format_html(
        '<table class="soniq-steps"><thead><tr><th>step</th><th>recorded</th>'
        "<th>by attempt</th><th>size</th></tr></thead><tbody>{}</tbody></table>{}",
        rows, more)
