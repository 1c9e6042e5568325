"""Item 4: runtime control of limits per key -- the command, the admin, the dashboard.

An operator throttles one key (or a pattern of keys) without a deploy, and
sees the keys at their limit with their waiting counts. Both databases.
"""

import io

import pytest
from django.core.management import CommandError, call_command

from soniq_django import bulk_enqueue
from soniq_django.keys.limits import key_states, set_key_limit
from soniq_django.keys.models import KeyLimit, KeySlot
from soniq_django.models import Job
from soniq_django.producer.request import JobRequest
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db


def fill(key, n, limit=None):
    return bulk_enqueue([JobRequest("ops.job", {"n": i}, concurrency_key=key,
                                    key_concurrency=limit) for i in range(n)])


def claim_all(source):
    got = []
    while True:
        more = source.claim_many_owned("w", claim_tokens=[nonce() for _ in range(5)])
        if not more:
            return got
        got += more


def test_soniq_queue_limit_key_throttles_one_noisy_tenant_at_once(source):
    fill("noisy", 6)
    fill("calm", 2)
    out = io.StringIO()
    call_command("soniq_queue", "limit-key", "default", "noisy", "--concurrency", "1", stdout=out)
    assert "Limited noisy" in out.getvalue()
    got = claim_all(source)
    keys = sorted(Job.objects.filter(id__in=[c.job_id for c in got]).values_list(
        "concurrency_key", flat=True))
    assert keys == ["calm", "calm", "noisy"]
    out = io.StringIO()
    call_command("soniq_queue", "keys", stdout=out)
    text = out.getvalue()
    assert "noisy" in text and "at its limit" in text
    (state,) = key_states(at_limit_only=True)
    assert (state.key, state.running, state.waiting, state.concurrency) == ("noisy", 1, 5, 1)
    out = io.StringIO()
    call_command("soniq_queue", "clear-key", "default", "noisy", stdout=out)
    assert out.getvalue().strip() == "Cleared."
    assert len(claim_all(source)) == 5  # no limit declared: the rest run


def test_a_lowered_limit_takes_back_the_offered_job(source):
    fill("k", 4, limit=2)
    claim_all(source)
    assert KeySlot.objects.get(key="k").running == 2
    set_key_limit("default", "k", concurrency=3)
    assert KeySlot.objects.get(key="k").head is not None
    set_key_limit("default", "k", concurrency=2)
    assert KeySlot.objects.get(key="k").head is None
    assert claim_all(source) == []


def test_bad_values_are_command_errors():
    with pytest.raises(CommandError):
        call_command("soniq_queue", "limit-key", "default", "k", "--rate", "lots",
                     stdout=io.StringIO())
    with pytest.raises(CommandError):
        call_command("soniq_queue", "limit-key", "default", "k", "--concurrency", "0",
                     stdout=io.StringIO())
    assert not KeyLimit.objects.exists()


def test_the_admin_saves_an_override_and_applies_it(admin_client, source):
    fill("t-1", 3)
    response = admin_client.post("/admin/soniq_django/keylimit/add/", {
        "queue": "default", "key_pattern": "t-*", "concurrency": "1"})
    assert response.status_code == 302, response.content[:500]
    assert len(claim_all(source)) == 1
    page = admin_client.get("/admin/soniq_django/keyslot/")
    assert page.status_code == 200 and b"t-1" in page.content


def test_the_dashboard_shows_keys_at_their_limit_with_their_waiting_counts(admin_client, source):
    fill("busy-tenant", 4, limit=1)
    claim_all(source)
    page = admin_client.get("/admin/soniq_django/dashboard/")
    html = page.content.decode()
    part = html.split('id="soniq-keys"')[1].split("</table>")[0]
    assert "busy-tenant" in part and ">3<" in part
