"""A process whose clock is off: libfaketime (Debian's ``faketime`` package) in its environment.

``skewed("+11m")`` is the environment that makes a child process's wall
clock 11 minutes fast (``"-2m"``: 2 minutes slow) from its first
instruction; its monotonic clock is left alone, so its timeouts and sleeps
are as long as usual. Only that process's idea of the time changes: the
database server's clock stays right, as with a host whose NTP failed.
scripts/run-tests installs the package as root when it is missing.
"""

import glob

from tests.support.ci import unavailable

#: Where Debian puts the thread-safe library (the worker has threads).
PATTERN = "/usr/lib/*/faketime/libfaketimeMT.so.1"


def skewed(offset: str) -> dict[str, str]:
    """The environment of a process whose wall clock is ``offset`` off (``"+11m"``, ``"-2m"``)."""
    found = sorted(glob.glob(PATTERN))
    if not found:
        unavailable("libfaketime is not installed (Debian's faketime package; scripts/run-tests "
                    "installs it as root)")
    return {"LD_PRELOAD": found[0], "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_DONT_RESET": "1"}
