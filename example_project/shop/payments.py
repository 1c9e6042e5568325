"""A stand-in for a payment provider's API, for the example's exactly-once confirmation.

Real providers (Stripe, Adyen, ...) take an idempotency key with each
request: a request repeated with the same key gets the first one's answer
back instead of a second charge. This one keeps its charges in memory,
per process, which is enough for the demo and the tests. ``fail_after_charging(n)``
makes the next ``n`` calls charge and then fail, as a request whose answer
was lost on the way back: the worst case for a retry.
"""

import secrets
import threading
from dataclasses import dataclass


class PaymentTimeout(Exception):
    """The provider did not answer in time (it may well have charged)."""


@dataclass(frozen=True)
class Charge:
    reference: str
    amount_cents: int
    idempotency_key: str


class FakeGateway:
    def __init__(self):
        self._lock = threading.Lock()
        self._by_key: dict[str, Charge] = {}
        self._failures = 0

    def charge(self, amount_cents: int, *, idempotency_key: str) -> Charge:
        """Charge once per key; the same key again returns the first charge."""
        with self._lock:
            charge = self._by_key.get(idempotency_key)
            if charge is None:
                charge = Charge(f"ch_{secrets.token_hex(6)}", amount_cents, idempotency_key)
                self._by_key[idempotency_key] = charge
            if self._failures:
                self._failures -= 1
                raise PaymentTimeout("the payment provider did not answer")
            return charge

    def charges(self) -> list[Charge]:
        with self._lock:
            return list(self._by_key.values())

    def fail_after_charging(self, times: int) -> None:
        with self._lock:
            self._failures = times

    def reset(self) -> None:
        with self._lock:
            self._by_key.clear()
            self._failures = 0


gateway = FakeGateway()
