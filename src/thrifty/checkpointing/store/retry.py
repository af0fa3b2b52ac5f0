"""Bounded retries with exponential backoff, for transient storage errors only."""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from thrifty.checkpointing.store.errors import TransientStorageError

log = logging.getLogger("thrifty.checkpointing.store")
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Retry a TransientStorageError up to `retries` times, or until a deadline.

    Attempt k waits `backoff * 2**k` seconds (at most `max_backoff`), scaled by a random factor
    in [0.5, 1] so that many workers hitting one bucket do not retry in lockstep.
    """

    retries: int = 5
    backoff: float = 1.0
    max_backoff: float = 30.0

    def call(
        self,
        fn: Callable[[], T],
        what: str,
        *,
        until: float | None = None,
        stop: threading.Event | None = None,
    ) -> T:
        """Run `fn`; permanent errors propagate at once, transient ones after the last retry.

        With `until` (a `time.monotonic()` value, seconds) retries go on until then whatever
        their count: s3fs and botocore retry underneath, so a count alone bounds nothing, and an
        outage shorter than the deadline must be survived. `stop` being set ends a wait early
        and raises the last error (the caller is shutting down).
        """
        for attempt in itertools.count():
            try:
                return fn()
            except TransientStorageError as exc:
                delay = min(self.backoff * 2**attempt, self.max_backoff) * random.uniform(0.5, 1)
                if until is None:
                    if attempt >= self.retries:
                        raise
                    left = f"retry {attempt + 1} of {self.retries}"
                else:
                    remaining = until - time.monotonic()
                    if remaining <= 0:
                        raise
                    delay = min(delay, remaining)
                    left = f"retry {attempt + 1}, giving up in {remaining:.0f} s"
                # The first retry is worth a warning; the rest of one outage is detail.
                level = logging.WARNING if attempt == 0 else logging.INFO
                log.log(level, "%s: %s; %s in %.1f s", what, exc, left, delay)
                if stop is None:
                    time.sleep(delay)
                elif stop.wait(delay):
                    raise
        raise AssertionError("unreachable")
