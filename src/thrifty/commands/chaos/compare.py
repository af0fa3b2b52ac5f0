"""Comparison of the two runs' final states: every tensor bit for bit, every other value exactly."""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from thrifty.errors import ThriftyError

# Values that legitimately differ between two runs of the same config: wall-clock time.
IGNORED = {"config", "progress.seconds"}
_MISSING = object()


def compare_runs(
    ref_dir: Path,
    chaos_dir: Path,
    ref_records: list[dict[str, Any]],
    chaos_records: list[dict[str, Any]],
) -> dict[str, Any]:
    """The report's comparison: final steps, state sections, per-step losses, the verdicts."""
    ref_step, ref_state = _final_state(ref_dir)
    chaos_step, chaos_state = _final_state(chaos_dir)
    sections = compare_states(ref_state, chaos_state)
    ref_loss = {r["step"]: r["loss"] for r in ref_records if "loss" in r}
    chaos_loss = {r["step"]: r["loss"] for r in chaos_records if "loss" in r}
    steps = set(ref_loss) | set(chaos_loss)
    differing = sorted(s for s in steps if ref_loss.get(s) != chaos_loss.get(s))
    weights = sections.get("model", {"identical": False})
    return {
        "final_step": {"reference": ref_step, "chaos": chaos_step},
        "state": sections,
        "losses_compared": len(ref_loss),
        "first_loss_difference": differing[0] if differing else None,
        "weights_match": bool(weights["identical"]) and ref_step == chaos_step,
        "match": ref_step == chaos_step and all(s["identical"] for s in sections.values()),
    }


def _final_state(run_dir: Path) -> tuple[int, dict[str, Any]]:
    from thrifty.checkpointing.store import CheckpointManager

    manager = CheckpointManager(str(run_dir / "checkpoints"))
    info = manager.latest()
    if info is None:
        raise ThriftyError(f"{run_dir} has no valid checkpoint to compare")
    return info.step, manager.load(info)


def compare_states(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Section by section (model, optimizer, progress, rng, ...): how many values were compared
    and which differ. Tensors must agree in dtype, shape and every bit; `IGNORED` is skipped."""
    sections: dict[str, dict[str, Any]] = {}
    for key in sorted(set(a) | set(b)):
        if key in IGNORED:
            continue
        differs: list[str] = []
        count = _compare(a.get(key, _MISSING), b.get(key, _MISSING), key, differs)
        sections[key] = {
            "compared": count,
            "identical": not differs,
            "differs": differs[:10],
            "differ_count": len(differs),
        }
    return sections


def _compare(a: Any, b: Any, where: str, differs: list[str]) -> int:
    """Append the dotted paths where `a` and `b` differ; return the number of leaves compared."""
    import torch

    if where in IGNORED:
        return 0
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return sum(
            _compare(a.get(k, _MISSING), b.get(k, _MISSING), f"{where}.{k}", differs)
            for k in sorted(set(a) | set(b), key=str)
        )
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        pairs = enumerate(zip(a, b, strict=True))
        return sum(_compare(x, y, f"{where}[{i}]", differs) for i, (x, y) in pairs)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            differs.append(where)
        elif a.dtype != b.dtype or a.shape != b.shape:
            differs.append(f"{where} ({a.dtype} {tuple(a.shape)} vs {b.dtype} {tuple(b.shape)})")
        elif not _same_bits(a, b):
            differs.append(where)
        return 1
    if isinstance(a, float) and isinstance(b, float):  # NaN equals NaN; 0.0 and -0.0 differ
        same = struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    else:
        same = type(a) is type(b) and a == b
    if not same:
        differs.append(where)
    return 1


def _same_bits(a: Any, b: Any) -> bool:
    import torch

    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    try:
        return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    except RuntimeError:  # a layout that has no byte view (sparse, quantized)
        return torch.equal(a, b)
