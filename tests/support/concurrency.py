"""Running test code in real threads, each with its own database connection."""

import threading

from django.db import connections


def run_threads(target, count):
    """Run ``target(index)`` in ``count`` threads released together; return their results.

    The first exception raised in a thread is re-raised here. Each thread
    closes its connections when done.
    """
    barrier = threading.Barrier(count)
    results, errors = [None] * count, []

    def body(index):
        try:
            barrier.wait()
            results[index] = target(index)
        except BaseException as error:  # reported in the main thread
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if errors:
        raise errors[0]
    return results
