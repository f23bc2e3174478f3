"""What the kernel adapters share: logging a message once per process (a fast path's choice is said once, not per call)."""

from __future__ import annotations

import logging

_logged: set[tuple[str, str]] = set()


def log_once(logger: logging.Logger, msg: str, level: int = logging.INFO) -> None:
    """``logger.log(level, msg)`` the first time this logger is given ``msg`` in this process."""
    if (logger.name, msg) not in _logged:
        _logged.add((logger.name, msg))
        logger.log(level, msg)
