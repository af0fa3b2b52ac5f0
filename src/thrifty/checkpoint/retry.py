"""Bounded retries with exponential backoff, for transient storage errors only."""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from thrifty.checkpoint.errors import TransientStorageError

log = logging.getLogger("thrifty.checkpoint")
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Retry a TransientStorageError up to `retries` times.

    Attempt k waits `backoff * 2**k` seconds (at most `max_backoff`), scaled by a random factor
    in [0.5, 1] so that many workers hitting one bucket do not retry in lockstep.
    """

    retries: int = 5
    backoff: float = 1.0
    max_backoff: float = 30.0

    def call(self, fn: Callable[[], T], what: str) -> T:
        """Run `fn`; permanent errors propagate at once, transient ones after the last retry."""
        for attempt in itertools.count():
            try:
                return fn()
            except TransientStorageError as exc:
                if attempt >= self.retries:
                    raise
                delay = min(self.backoff * 2**attempt, self.max_backoff) * random.uniform(0.5, 1)
                log.warning(
                    "%s: %s; retry %d of %d in %.1f s", what, exc, attempt + 1, self.retries, delay
                )
                time.sleep(delay)
        raise AssertionError("unreachable")
