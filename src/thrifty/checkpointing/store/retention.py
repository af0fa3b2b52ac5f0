"""Which checkpoints to keep (the newest `keep_last`, plus the best by metric if asked), and
deleting the others safely: only folders that hold nothing but what a save writes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from thrifty.checkpointing.store.loading import STATE_FILE
from thrifty.checkpointing.store.manifest import MANIFEST, step_dir
from thrifty.checkpointing.store.storage import Storage

log = logging.getLogger("thrifty")
_KEPT: set[str] = set()  # folders kept for someone's file, each said once a process

# What a save writes into its step folder (and the temporary names it writes them under).
SAVE_NAMES = frozenset(
    {STATE_FILE, f"{STATE_FILE}.tmp", MANIFEST, f"{MANIFEST}.tmp", "shards"}  # sharded.SHARDS_DIR
)


def holds_only_a_save(names: list[str]) -> bool:
    """Whether a step folder's entries are all a save's own: a folder named like a save that
    holds anything else is someone's, and is never written into or deleted."""
    return all(name in SAVE_NAMES for name in names)


def checkpoints_to_keep(
    published: Mapping[int, float | None], *, keep_last: int, keep_best: bool
) -> set[int]:
    """Steps to keep among `published` (step -> metric, lower is better; None is unranked).

    The newest checkpoints are always kept, so whatever is dropped has `keep_last` newer ones
    published beside it. Ties on the metric keep the newer step.
    """
    steps = sorted(published)
    keep = set(steps[-keep_last:]) if keep_last > 0 else set()
    if keep_best:
        ranked = [(metric, -step) for step, metric in published.items() if metric is not None]
        if ranked:
            keep.add(-min(ranked)[1])
    return keep


def _direct(fn: Callable[[], Any], what: str) -> Any:
    return fn()


def purge(
    storage: Storage,
    published: dict[int, Any],
    keep: set[int],
    orphans: list[int],
    call: Callable[[Callable[[], Any], str], Any] = _direct,
) -> None:
    """Delete published checkpoints not in `keep` (manifest first) and stale partial folders.

    Only steps below the newest published one are touched, so a save in progress is never
    deleted. Folders whose manifest could not be read are not in `published` or `orphans` and
    are never deleted; nor is a folder that holds anything a save does not write (a file put
    into a save, or a folder without a manifest that is not a killed save but someone's): a
    published one is kept whole, with a warning. `call(fn, what)` runs each deletion and
    listing (e.g. with retries); deleted steps are removed from `published`.
    """
    newest = max(published, default=None)
    if newest is None:
        return
    for step in sorted(published):
        if step not in keep and step < newest:
            name = step_dir(step)
            names = call(partial(storage.list, name), "purge")
            if not holds_only_a_save(names):
                _say_kept(storage, name, names)
                continue
            call(partial(storage.delete, f"{name}/{MANIFEST}"), "purge")
            del published[step]
            call(partial(storage.delete, name), "purge")
    # Folders without a manifest below the newest step are leftovers of a killed save.
    for name in [step_dir(step) for step in orphans if step < newest]:
        if holds_only_a_save(call(partial(storage.list, name), "purge")):
            call(partial(storage.delete, name), "purge")


def _say_kept(storage: Storage, name: str, names: list[str]) -> None:
    where = f"{storage.uri.rstrip('/')}/{name}"
    if where in _KEPT:
        return
    _KEPT.add(where)
    foreign = ", ".join(n for n in names if n not in SAVE_NAMES)
    log.warning(
        "kept checkpoint %s past checkpoint.keep_last: it holds %s, which thrifty did not "
        "write; move that away and thrifty deletes the checkpoint at its next save",
        where,
        foreign,
    )
