"""The object-store part of a RunLock: a lease object `<location>/.thrifty-lease.json`.

It holds an owner and an expiry, renewed every ttl/4 by the lock's background thread while the
run lives. Object stores offer no compare-and-swap through fsspec, so a lease is written, read
back after `settle` seconds and kept only if it is still ours (see `thrifty.rundir.lock` for the
races this leaves). Loaded only for a checkpoint location that is a URL.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from thrifty.errors import ThriftyError
from thrifty.rundir.holder import LEASE_FILE, Holder, RunInUseError

log = logging.getLogger("thrifty.rundir.lock")


class Lease:
    """`<location>/.thrifty-lease.json`: an owner and an expiry, renewed while the run lives."""

    needs_renewal = True

    def __init__(self, storage: Any, label: str, holder: Holder, ttl: float, settle: float) -> None:
        self.storage, self.label, self.holder = storage, label, holder
        self.ttl, self.settle = ttl, settle
        self.lost: str | None = None

    def _current(self) -> Holder | None:
        try:
            data = self.storage.read_bytes(LEASE_FILE)
        except FileNotFoundError:
            return None
        holder = Holder.parse(data)
        if holder is None:  # object stores write whole objects: this one is not a lease
            log.warning("%s/%s is not a lease: replacing it", self.label, LEASE_FILE)
        return holder

    def _write(self) -> None:
        lease = replace(self.holder, expires=time.time() + self.ttl)
        self.storage.write_bytes(LEASE_FILE, lease.to_bytes())

    def in_use(self, holder: Holder | None) -> RunInUseError:
        who = "another process"
        if holder is not None:
            until = datetime.fromtimestamp(holder.expires or 0, timezone.utc)
            who = f"{holder.describe()} (lease until {until.isoformat(timespec='seconds')})"
        return RunInUseError(
            f"{self.label} is in use by {who}: wait for it to end, "
            "or use another checkpoint.location"
        )

    def acquire(self) -> None:
        current = self._current()
        if current is not None and current.token != self.holder.token:
            why = self.holder.why_gone(current)
            if why is None and (current.expires or 0.0) > time.time():
                raise self.in_use(current)
            log.warning(
                "took over the %s on %s from %s%s",
                "lease" if why else "expired lease",
                self.label,
                current.describe(),
                f", {why}" if why else "",
            )
        self._write()
        # No compare-and-swap: let a concurrent writer land, then keep the lease only if ours.
        time.sleep(self.settle)
        after = self._current()
        if after is None or after.token != self.holder.token:
            raise self.in_use(after)

    def renew(self) -> None:
        try:
            current = self._current()
            if current is None or current.token != self.holder.token:
                self.needs_renewal = False
                who = current.describe() if current else "nobody"
                self.lost = f"lost the lease on {self.label}: it is now held by {who}"
                log.error("%s; two runs may now write there", self.lost)
                return
            self._write()
        except ThriftyError as exc:  # the next renewal may get through; the lease has slack
            log.warning("could not renew the lease on %s: %s", self.label, exc)

    def release(self) -> None:
        current = self._current()
        if current is not None and current.token == self.holder.token:
            self.storage.delete(LEASE_FILE)
