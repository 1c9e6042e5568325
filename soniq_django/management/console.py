"""The long-running commands' own log on stderr, for projects that did not configure one.

``soniq_worker`` and ``soniq_scheduler`` log through ``logging`` (the
``soniq_django`` loggers). A project that configured where those records
go keeps its configuration untouched. One that did not -- a fresh
``startproject`` has no ``LOGGING`` -- would see nothing but Python's
last-resort handler's bare warnings, so for the duration of the command
``command_log()`` puts a handler of its own on the ``soniq_django`` logger:
the command's stderr, one line per record (time, level, message), and the
logger's level from ``--verbosity``. Both are taken off when the command
returns, so ``call_command`` can run it any number of times in one process.

*Configured* means that a record of ``soniq_django`` or of a logger below
it already reaches a handler: one on ``soniq_django`` or on an ancestor it
propagates to (the root logger included), or one on any ``soniq_django.*``
logger (ours would double its lines). Django's own defaults
(``DEFAULT_LOGGING``) put handlers on the ``django`` loggers only, which
are not on that path; Python's last-resort handler is no configuration.
"""

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

LOGGER = "soniq_django"
#: ``--verbosity`` → the level of the ``soniq_django`` logger (2 and 3: DEBUG).
LEVELS = {0: logging.WARNING, 1: logging.INFO}
FORMAT = "%(asctime)s %(levelname)-7s %(message)s"


def level_for(verbosity: int) -> int:
    return LEVELS.get(verbosity, logging.DEBUG)


def configured(name: str = LOGGER) -> bool:
    """Whether records of logger ``name`` (or of a logger below it) already reach a handler."""
    current: logging.Logger | None = logging.getLogger(name)
    while current is not None:
        if current.handlers:
            return True
        if not current.propagate:
            break
        current = current.parent
    below = name + "."
    return any(
        isinstance(logger, logging.Logger) and logger.handlers
        for logger_name, logger in list(logging.Logger.manager.loggerDict.items())
        if logger_name.startswith(below)
    )


class CommandHandler(logging.Handler):
    """Writes each record as one line to a command's ``stderr`` (an ``OutputWrapper``).

    On a terminal, warnings and errors take the command's colours
    (``--no-color`` turns them off); elsewhere lines are plain text.
    """

    def __init__(self, output: Any, style: Any) -> None:
        super().__init__()
        self.output = output
        colour = output.isatty()
        self.styles = {logging.WARNING: style.WARNING, logging.ERROR: style.ERROR,
                       logging.CRITICAL: style.ERROR} if colour else {}
        formatter = logging.Formatter(FORMAT)
        formatter.default_msec_format = "%s.%03d"
        self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            self.output.write(line, style_func=self.styles.get(record.levelno, _plain),
                              ending="\n")
            self.output.flush()
        except Exception:
            self.handleError(record)


def _plain(text: str) -> str:
    return text


@contextmanager
def command_log(command: Any, verbosity: int) -> Iterator[bool]:
    """While the block runs: ``command``'s own log on its stderr, unless logging is configured.

    Yields whether it installed one. The ``soniq_django`` logger's level is
    set from ``verbosity`` (0: warnings and errors, 1: INFO, 2 and 3: DEBUG)
    only then; the level and handlers it had are restored afterwards.
    """
    if configured():
        yield False
        return
    logger = logging.getLogger(LOGGER)
    handler = CommandHandler(command.stderr, command.style)
    previous = logger.level
    logger.setLevel(level_for(verbosity))
    logger.addHandler(handler)
    try:
        yield True
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
        handler.close()
