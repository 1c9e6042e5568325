"""The psql examples of docs/sql-api.md, run with the psql binary against the test database.

Every fenced block tagged ``sql`` is run, in document order, each in its own
psql session, as a reader following the page would run them. A block whose
first line is ``-- fails with SQLSTATE [SONIQ_CODE]`` must fail with exactly
that SQLSTATE and HINT; every other block must succeed. The role name
``checkout_service`` is replaced by a unique one (roles are cluster-wide).
"""

import re
from pathlib import Path

import pytest
from django.db import connection

from tests.support.sql import Roles, quote_ident, raw, run_psql, unique_name

pytestmark = [pytest.mark.postgresql_only, pytest.mark.django_db(transaction=True)]

DOC = Path(__file__).resolve().parents[2] / "docs" / "sql-api.md"
BLOCK = re.compile(r"^```sql\n(.*?)^```$", re.DOTALL | re.MULTILINE)
FAILS = re.compile(r"-- fails with (?P<state>[0-9A-Z]{5})(?: (?P<hint>SONIQ_[A-Z_]+))?\n")
DOC_ROLE = "checkout_service"


def sql_blocks() -> list[tuple[int, str]]:
    text = DOC.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in BLOCK.finditer(text)]


@pytest.mark.django_db  # reads the file only; no need for the transactional flush
def test_the_page_has_runnable_and_failing_examples():
    blocks = [body for _, body in sql_blocks()]
    assert len(blocks) >= 15
    failing = [FAILS.match(body).group("state") for body in blocks if FAILS.match(body)]
    assert {"22023", "23505", "22P05", "42501"} <= set(failing)
    hints = {FAILS.match(body).group("hint") for body in blocks if FAILS.match(body)}
    assert {"SONIQ_INVALID_TASK_NAME", "SONIQ_TASK_ARGS_INVALID", "SONIQ_INVALID_MAX_ATTEMPTS",
            "SONIQ_INVALID_OPTION"} <= hints
    assert any("soniq_get_job" in body for body in blocks)
    assert any("pg_notify" in body for body in blocks)


def test_every_psql_example_in_the_docs_behaves_as_stated():
    role = unique_name("soniq_doc_role")
    roles = Roles()
    roles.created.append(role)  # the docs create it; dropped below
    database = quote_ident(connection.settings_dict["NAME"])
    problems = []
    try:
        for line, body in sql_blocks():
            sql = body.replace(DOC_ROLE, role)
            result = run_psql(sql)
            expected = FAILS.match(body)
            errors = re.findall(r"ERROR:  ([0-9A-Z]{5}): ", result.stderr)
            hints = re.findall(r"^HINT:  (\S+)", result.stderr, flags=re.MULTILINE)
            where = f"docs/sql-api.md line {line}"
            if expected is None:
                if result.returncode != 0 or errors:
                    problems.append(f"{where} failed:\n{result.stderr}")
            else:
                wanted_hint = [expected.group("hint")] if expected.group("hint") else []
                if result.returncode == 0 or errors != [expected.group("state")] or (
                        hints != wanted_hint):
                    problems.append(
                        f"{where} should fail with {expected.group('state')} "
                        f"{expected.group('hint') or ''}, got exit {result.returncode}:\n"
                        f"{result.stderr}")
    finally:
        with raw() as admin:
            admin.execute(f"ALTER DATABASE {database} RESET soniq.task_name_pattern")
            exists = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone()
        if exists:
            roles.drop_all()
    assert problems == []
    # The examples really ran: their jobs are in the table.
    with raw() as conn:
        names = {row[0] for row in conn.execute("SELECT DISTINCT job_name FROM soniq_jobs")}
        unique = conn.execute(
            "SELECT count(*) FROM soniq_jobs WHERE job_name = 'reports.daily_summary' "
            "AND args = '{\"day\": \"2024-05-01\"}'").fetchone()[0]
    assert {"billing.send_invoice", "billing.send-invoice", "reports.daily_summary",
            "mail.send_receipt"} <= names
    assert unique == 1
