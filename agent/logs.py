"""Logging to stderr with the attempt id on every line, so one attempt's story can be grepped."""

from __future__ import annotations

import logging
import sys

NO_ATTEMPT = "-"
FORMAT = "%(asctime)s %(levelname)s %(name)s attempt=%(attempt)s %(message)s"


class _AttemptDefault(logging.Filter):
    """Give records that are not about an attempt a placeholder, so the format never breaks."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "attempt"):
            record.attempt = NO_ATTEMPT
        return True


def setup_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_AttemptDefault())
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger("agent")
    root.handlers[:] = [handler]
    root.setLevel(level)
    # The agent's lines are the product here; httpx's own request logs would only add noise.
    root.propagate = False
    logging.getLogger("httpx").setLevel(logging.WARNING)


def alog(logger: logging.Logger, level: int, attempt_id: int | None, msg: str, *args: object) -> None:
    """Log one line about an attempt (``attempt_id=None`` for node-level lines)."""
    attempt = NO_ATTEMPT if attempt_id is None else str(attempt_id)
    logger.log(level, msg, *args, extra={"attempt": attempt})
