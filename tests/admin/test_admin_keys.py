"""The key limits admin form: it refuses what the claim cannot apply, as the queue form does."""

import pytest
from django.urls import reverse

from soniq_django.keys.models import KeyLimit

pytestmark = pytest.mark.django_db


def _form(**values) -> dict:
    form = {"queue": "default", "key_pattern": "tenant:*", "concurrency": "", "rate_limit": "",
            "rate_period": ""}
    form.update({key: str(value) for key, value in values.items()})
    return form


@pytest.mark.parametrize(("values", "error"), [
    ({"rate_limit": 5}, "Set a rate&#x27;s count and its period together"),
    ({"rate_period": 5}, "Set a rate&#x27;s count and its period together"),
    ({"concurrency": 0}, "Must be at least 1"),
    ({"rate_limit": 0, "rate_period": 5}, "Must be at least 1"),
    ({"rate_limit": 5, "rate_period": 86401}, "At most 86400 seconds"),
    ({"key_pattern": "x" * 256, "concurrency": 1}, "1 to 255 characters, without NUL"),
])
def test_the_form_refuses_limits_the_claim_cannot_apply(admin_client, values, error):
    response = admin_client.post(reverse("admin:soniq_django_keylimit_add"), _form(**values))
    assert response.status_code == 200 and error in response.content.decode()
    assert not KeyLimit.objects.exists()


def test_the_form_saves_a_limit_within_the_bounds(admin_client):
    response = admin_client.post(reverse("admin:soniq_django_keylimit_add"),
                                 _form(concurrency=2, rate_limit=5, rate_period=86400))
    assert response.status_code == 302, response.content[:2000]
    row = KeyLimit.objects.get()
    assert (row.concurrency, row.rate_limit, row.rate_period) == (2, 5, 86400)
