"""docs/internals.md stays true: its state table is JobStatus', the files it names exist."""

import re
from pathlib import Path

from soniq_django.models import JobStatus

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "internals.md"
STATE_PAGES = ("storage-format.md", "claim-protocol.md", "worker.md")


def _table(text: str) -> list[str]:
    lines = [line.strip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("====="))
    end = max(i for i, line in enumerate(lines) if line.startswith("====="))
    return [line for line in lines[start:end + 1]]


def test_the_state_table_is_the_one_in_jobstatus():
    page = DOC.read_text(encoding="utf-8")
    block = re.search(r"<!-- state table:.*?-->\n```\n(.*?)```\n<!-- end of state table -->",
                      page, re.S)
    assert block, "docs/internals.md lost its state table markers"
    assert _table(block.group(1)) == _table(JobStatus.__doc__)


def test_every_file_the_page_names_exists():
    page = DOC.read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:soniq_django|tests|docs|bench)/[\w./-]+\.(?:py|sql|md))`", page))
    named |= {f"soniq_django/{p}" for p in re.findall(r"`((?:worker|owned|producer|sql|schema|"
                                                   r"admin|management/commands)/[\w.]+\.(?:py|sql))`",
                                                   page)}
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert named and not missing, f"docs/internals.md names missing files: {missing}"


def test_the_worker_table_lists_every_worker_module():
    page = DOC.read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(\w+\.py)` \|", page, re.M))
    present = {p.name for p in (ROOT / "soniq_django" / "worker").glob("*.py")} - {"__init__.py"}
    assert listed == present


def test_pages_that_describe_states_link_the_state_machine():
    for name in STATE_PAGES:
        text = (ROOT / "docs" / name).read_text(encoding="utf-8")
        assert "internals.md#the-job-state-machine" in text, name
