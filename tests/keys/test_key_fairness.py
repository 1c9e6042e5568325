"""Item 3: fairness between keys at equal priority, and priorities still win.

The rule (docs/keys.md): each key offers one job at a time, its first by
(priority, created_at); the claims take offered jobs in claim order. So a
busy key's backlog is never in front of a quiet key's job: at most its one
offered job is. Both databases.
"""

import pytest

from soniq_django import bulk_enqueue, enqueue
from soniq_django.models import Job
from soniq_django.producer.request import JobRequest
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db


def drain(source, batch, rounds):
    """Claim ``batch`` at a time and complete each, ``rounds`` times; the keys in claim order."""
    order = []
    for _ in range(rounds):
        got = source.claim_many_owned("w", claim_tokens=[nonce() for _ in range(batch)])
        keys = dict(Job.objects.filter(id__in=[c.job_id for c in got]).values_list(
            "id", "concurrency_key"))
        order += [keys[c.job_id] for c in got]
        for claimed in got:
            assert source.complete_owned(claimed.claim_fence) is True
    return order


@pytest.mark.parametrize("limit", [1, 5, None])
def test_quiet_keys_do_not_wait_behind_a_busy_keys_backlog(source, limit):
    bulk_enqueue([JobRequest("fair.job", {"n": n}, concurrency_key="busy", key_concurrency=limit)
                  for n in range(300)])
    bulk_enqueue([JobRequest("fair.job", {"n": n}, concurrency_key=f"quiet{k}",
                             key_concurrency=limit) for n in range(3) for k in range(9)])
    order = drain(source, batch=4, rounds=12)
    quiet = [i for i, key in enumerate(order) if key != "busy"]
    # All 27 quiet jobs within the first 48 claimed, whatever the busy key's limit:
    # at most one busy job in each claim of four.
    assert len(quiet) == 27
    assert order.count("busy") <= 12 + 1


def test_priorities_win_over_fairness_across_keys():
    from soniq_django.owned import OwnedJobSource
    source = OwnedJobSource()
    enqueue("fair.job", {}, concurrency_key="a", priority=100)
    urgent = [enqueue("fair.job", {"n": n}, concurrency_key="b", priority=1) for n in range(3)]
    plain = enqueue("fair.job", {}, priority=50)
    got = []
    for _ in range(5):
        (claimed,) = source.claim_many_owned("w", claim_tokens=[nonce()])
        got.append(claimed.job_id)
        assert source.complete_owned(claimed.claim_fence) is True
    # Key b's urgent jobs first, one after another (each offered as the last ends),
    # then the plain job of priority 50, then key a's.
    assert got[:4] == [*urgent, plain]
