"""How an enqueue meets the caller's transactions when jobs live in a database of their own.

With one database the job row and the caller's rows share a transaction.
With a router that sends soniq_django's tables to another alias (see
docs/deployment.md, "A separate jobs database"), they cannot: every alias
is a connection of its own. So:

- ``after_commit`` (behind ``enqueue_on_commit``) hooks onto **every**
  alias whose ``atomic()`` block is open at the call, and runs the insert
  once all of them have committed; if any of them rolls back, it never
  runs. soniq cannot tell which open transaction holds the caller's rows,
  so it waits for all of them: a job never exists for rows that were
  rolled back.
- ``warn_if_uncoupled`` (behind ``enqueue()``): an insert on the jobs alias
  while a transaction is open on another alias only, and none on the jobs
  alias, commits at once, whatever that transaction does later; that is a
  ``RuntimeWarning``. With one database, or with a transaction open on the
  jobs alias too (``ATOMIC_REQUESTS`` on both, say), it stays silent.
"""

import warnings
from collections.abc import Callable

from django.db import connections, transaction


def open_transactions() -> list[str]:
    """The aliases of this thread's connections that are inside an ``atomic()`` block."""
    return [connection.alias for connection in connections.all(initialized_only=True)
            if connection.in_atomic_block]


def after_commit(callback: Callable[[], object], alias: str) -> None:
    """Run ``callback`` once every transaction open now has committed.

    ``alias`` is the jobs database. With no ``atomic()`` block open anywhere
    this is ``transaction.on_commit(callback, using=alias)``: the callback
    runs at once (Django refuses under manual transaction management). An
    exception of the callback propagates from the exit of the ``atomic()``
    block that committed last, as ``on_commit`` does; the rows of every
    transaction have been committed by then.
    """
    waiting = set(open_transactions())
    if not waiting:
        transaction.on_commit(callback, using=alias)
        return

    def committed(name: str) -> None:
        waiting.discard(name)
        if not waiting:
            callback()

    for name in sorted(waiting):
        # Django drops the hook of an alias whose block (or savepoint) rolls
        # back: ``waiting`` then never empties and the callback never runs.
        transaction.on_commit(lambda name=name: committed(name), using=name)


def warn_if_uncoupled(alias: str, stacklevel: int = 2) -> None:
    """Warn when an insert on ``alias`` now cannot follow the caller's open transaction.

    That is: no ``atomic()`` block is open on ``alias`` but one is on another
    alias. Emits a ``RuntimeWarning`` (``stacklevel`` counts from the caller
    of this function's caller); returns nothing.
    """
    if connections[alias].in_atomic_block or len(connections.settings) == 1:
        return  # with one database there is no other transaction to be outside of
    others = [name for name in open_transactions() if name != alias]
    if others:
        warnings.warn(
            f"A job is inserted on database {alias!r} at once, outside the transaction open on "
            f"{', '.join(map(repr, others))}: it is committed even if that transaction rolls "
            "back. Use enqueue_on_commit() to insert it after the commit (see "
            "docs/deployment.md, 'A separate jobs database').",
            RuntimeWarning,
            stacklevel=stacklevel + 1,
        )
