"""The worker's claim nonces: 128 random bits each, in 22 characters of URL-safe base64.

Shorter than 32 hex characters for the same bits: every claimed row carries its
nonce twice and soniq_jobs_claim_token_key indexes it twice, so the 10 bytes count
in the WAL of every job (docs/performance.md#wal-per-job).
"""

import base64
import re

from soniq_django.worker.writes import nonces


def test_each_nonce_is_128_bits_in_22_url_safe_characters():
    found = nonces(200)
    assert len(found) == 200
    assert len(set(found)) == 200
    for nonce in found:
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", nonce)
        assert len(base64.urlsafe_b64decode(nonce + "==")) == 16


def test_one_nonce_and_none():
    assert len(nonces(1)) == 1 and nonces(0) == []
