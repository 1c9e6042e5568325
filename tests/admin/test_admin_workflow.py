"""A job's workflow on its admin page and its dead letter's: dependencies and dependents linked
both ways with their states, a batch's progress with links to members and callback, escaped,
and only the links a user's view permissions allow. Both databases."""

import html as htmllib
import uuid

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from soniq_django import JobRequest, batch, enqueue, job
from soniq_django.models import Job
from soniq_django.owned import OwnedJobSource
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db

HOSTILE = "wfa.<script>x</script>"


@job(name="wfa.step")
def step() -> None:
    return None


def job_page(job_id) -> str:
    return reverse("admin:soniq_django_job_change", args=[job_id])


def dead_page(job_id) -> str:
    return reverse("admin:soniq_django_deadletterjob_change", args=[job_id])


def section(page: str) -> str:
    """The page's workflow field, its HTML."""
    start = page.index("field-workflow")
    return page[start:page.index("</fieldset>", start)]


def run_one(job_id, *, fail: bool = False) -> None:
    source = OwnedJobSource()
    claimed = source.claim_next_owned("wfa-worker", claim_token=nonce())
    assert claimed is not None and uuid.UUID(str(claimed.job_id)) == job_id
    if fail:
        assert source.fail_owned(claimed.claim_fence, "no", retry=False) is True
    else:
        assert source.complete_owned(claimed.claim_fence) is True


def test_dependencies_and_dependents_link_both_ways_with_their_states(admin_client):
    first = enqueue("wfa.step")
    second = enqueue("wfa.step", depends_on=[first])
    third = enqueue("wfa.step", depends_on=[first, second])
    page = section(admin_client.get(job_page(third)).content.decode())
    assert "Depends on (waits for 2 more)" in page
    assert page.count(f'href="{job_page(first)}"') == 1
    assert f'href="{job_page(second)}"' in page
    assert "queued</span> (edge waiting)" in page
    page = section(admin_client.get(job_page(first)).content.decode())
    assert "Dependents:" in page and "Depends on" not in page
    assert f'href="{job_page(second)}"' in page and f'href="{job_page(third)}"' in page
    run_one(first)
    page = section(admin_client.get(job_page(second)).content.decode())
    assert "done</span> (edge done)" in page and "waits for" not in page
    # A job in no workflow says so.
    plain = enqueue("wfa.step")
    assert "-" == htmllib.unescape(section(admin_client.get(job_page(plain)).content.decode())
                                   .split("<div class=\"readonly\">")[1].split("</div>")[0])


def test_a_dead_lettered_dependency_links_to_its_dead_letter_and_back(admin_client):
    first = enqueue("wfa.step", max_attempts=1)
    second = enqueue("wfa.step", depends_on=[first])
    run_one(first, fail=True)
    page = section(admin_client.get(job_page(second)).content.decode())
    assert f'href="{dead_page(first)}"' in page and "dead-lettered" in page
    assert "(edge failed)" in page
    page = section(admin_client.get(dead_page(first)).content.decode())
    assert "Dependents:" in page and f'href="{job_page(second)}"' in page
    assert "cancelled" in page


def test_a_batch_shows_its_progress_with_links_to_members_and_callback(admin_client):
    info = batch([JobRequest("wfa.step") for _ in range(3)]
                 + [JobRequest("wfa.step", max_attempts=1)],
                 on_complete=JobRequest("wfa.step"))
    run_one(info.job_ids[0])
    run_one(info.job_ids[1])
    Job.objects.filter(id=info.job_ids[1]).delete()  # purged
    page = section(admin_client.get(job_page(info.callback_id)).content.decode())
    assert f"Batch <code>{info.id}</code>, 4 members: 1 done, 0 failed, 2 pending, 1 purged." \
        in page
    for member in (info.job_ids[0], info.job_ids[2], info.job_ids[3]):
        assert f'href="{job_page(member)}"' in page
    assert f'href="{job_page(info.job_ids[1])}"' not in page and "purged</span>" in page
    assert "Depends on (waits for 2 more)" in page  # the callback's own edges
    # A member's page shows the same batch, with the callback linked.
    page = section(admin_client.get(job_page(info.job_ids[2])).content.decode())
    assert f"Callback: <a href=\"{job_page(info.callback_id)}\">" in page
    assert "Dependents:" in page
    run_one(info.job_ids[2])
    run_one(info.job_ids[3], fail=True)
    page = section(admin_client.get(dead_page(info.job_ids[3])).content.decode())
    assert "2 done, 1 failed, 0 pending, 1 purged" in page


def test_everything_is_escaped(admin_client):
    hostile = Job.objects.get(id=enqueue("wfa.step"))
    Job.objects.filter(id=hostile.id).update(job_name=HOSTILE)
    second = enqueue("wfa.step", depends_on=[hostile.id])
    page = admin_client.get(job_page(second)).content.decode()
    assert "<script>x</script>" not in page
    assert "wfa.&lt;script&gt;x&lt;/script&gt;" in section(page)


@pytest.fixture
def viewer(client, django_user_model):
    def make(*codenames):
        user = django_user_model.objects.create_user("staff", is_staff=True)
        user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
        client.force_login(user)
        return client
    return make


def test_a_view_job_user_gets_no_dead_letter_link_or_state(viewer):
    first = enqueue("wfa.step", max_attempts=1)
    second = enqueue("wfa.step", depends_on=[first])
    info = batch([JobRequest("wfa.step", max_attempts=1)], on_complete=JobRequest("wfa.step"))
    run_one(first, fail=True)
    run_one(info.job_ids[0], fail=True)
    client = viewer("view_job")
    page = section(client.get(job_page(second)).content.decode())
    assert dead_page(first) not in page and "dead-lettered" not in page
    assert "left the queue" in page and str(first) in page
    page = section(client.get(job_page(info.callback_id)).content.decode())
    assert "0 done, 0 failed, 0 pending, 1 left the queue" in page
    assert dead_page(info.job_ids[0]) not in page
    assert client.get(dead_page(first)).status_code == 403


def test_a_view_dead_letter_user_gets_no_job_links(viewer):
    first = enqueue("wfa.step", max_attempts=1)
    second = enqueue("wfa.step", depends_on=[first])
    run_one(first, fail=True)
    client = viewer("view_deadletterjob")
    page = section(client.get(dead_page(first)).content.decode())
    assert str(second) in page and job_page(second) not in page and "cancelled" in page
    assert client.get(job_page(second)).status_code == 403
