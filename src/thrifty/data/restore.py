"""A data pipeline put back at a checkpoint's position: the state its own `load_state_dict`
takes, or one line saying it does not."""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from typing import Any

import torch

from thrifty.data.sampling import training_rng_kept
from thrifty.errors import ThriftyError

# What a load_state_dict raises on a state it does not understand: a key it misses, a value
# or a type it does not expect.
_REJECTIONS = (KeyError, ValueError, TypeError, IndexError, AttributeError)


def resume_from(loader: Any, target: Any, saved: dict[str, Any], what: str) -> Iterator[Any]:
    """`target.load_state_dict` of the saved state, then a fresh iterator of `loader` (a
    stateful loader hands the state to the stream there, in its workers or in this process),
    then the loader's generator as it was saved. The training's generators are left as the
    checkpoint restored them: a new iterator draws its seed (from the global generator when
    the loader has none), which the uninterrupted run drew once, as the pass began. A state
    the pipeline rejects is one line naming `what` and the way out, not a traceback."""
    try:
        with training_rng_kept():
            target.load_state_dict(saved["state"])
            batches = iter(loader)
        generator = getattr(loader, "generator", None)
        if "generator" in saved and isinstance(generator, torch.Generator):
            generator.set_state(saved["generator"])
        return batches
    except Exception as exc:
        # The half-made iterator lives on in the traceback's frames: cleared, it is collected
        # now and its workers stopped (they ignore SIGTERM, so the interpreter's exit would
        # wait for them forever).
        traceback.clear_frames(exc.__traceback__)
        if isinstance(exc, ThriftyError) or not isinstance(exc, _REJECTIONS):
            raise  # not about the state (a source gone away, say): as it is
        problem = _rejection(exc)
    raise ThriftyError(
        f"{what} rejected the checkpoint's data position ({problem}): its load_state_dict "
        "does not take the state this run saved; resume with the data pipeline that wrote the "
        "checkpoint, or start the run over (--overwrite, run.overwrite = true)"
    )


def _rejection(exc: Exception) -> str:
    """`Type: message` of what the pipeline raised; from a loader's worker, the original's (the
    last line of the traceback it carries)."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    if "Original Traceback" in str(exc) and lines:
        return lines[-1].strip()
    return f"{type(exc).__name__}: {lines[0] if lines else 'no message'}"
