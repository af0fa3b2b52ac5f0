"""Loading a checkpoint never executes code from it."""

from __future__ import annotations

import hashlib
import json
import os
import sys

import pytest
import torch

from thrifty.checkpointing.store import CheckpointManager, UnsafeCheckpointError


class RunsACommand:
    """Unpickling this calls os.system: what a booby-trapped checkpoint would do."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def plant_checkpoint(folder, state) -> None:
    """Write a checkpoint folder by hand, with a manifest that matches its bytes."""
    folder.mkdir(parents=True)
    torch.save(state, folder / "state.pt")
    data = (folder / "state.pt").read_bytes()
    manifest = {
        "format": "thrifty-checkpoint",
        "format_version": 1,
        "step": int(folder.name.split("-")[1]),
        "created": "2026-01-01T00:00:00Z",
        "metric": None,
        "thrifty_version": "0",
        "torch_version": torch.__version__,
        "files": [
            {"name": "state.pt", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        ],
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.skipif(sys.platform == "win32", reason="uses touch")
def test_a_checkpoint_whose_pickle_would_run_a_command_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    folder = tmp_path / "ckpt" / "step-00000005"
    plant_checkpoint(folder, {"model": {"w": torch.ones(2)}, "x": RunsACommand(f"touch {marker}")})

    manager = CheckpointManager(str(tmp_path / "ckpt"))
    info = manager.latest()  # its bytes match its manifest: only loading can tell
    assert info is not None and info.step == 5
    for ref in (info, str(folder)):
        with pytest.raises(UnsafeCheckpointError) as excinfo:
            manager.load(ref)
        message = str(excinfo.value)
        assert "refusing to load" in message and "step-00000005/state.pt" in message
        assert "never executes code" in message and "\n" not in message
    assert not marker.exists()


def test_plain_tensors_and_values_load_with_weights_only(tmp_path):
    folder = tmp_path / "step-00000001"
    state = {"w": torch.arange(4), "meta": {"lr": 0.1, "name": "run", "flags": (True, None)}}
    plant_checkpoint(folder, state)
    loaded = CheckpointManager(str(tmp_path)).load(str(folder))
    assert torch.equal(loaded["w"], state["w"]) and loaded["meta"] == state["meta"]


def test_a_manifests_cost_record_round_trips_and_a_malformed_one_is_ignored():
    import json

    from thrifty.checkpointing.store.manifest import FileEntry, Manifest

    record = {"seconds": 12.5, "usd_per_hour": 3.0, "pricing": "spot", "gpus": 8}
    entry = FileEntry("state.pt", 10, "0" * 64)
    written = Manifest(7, (entry,), "2026-11-27T00:00:00Z", None, "x", "y", record).to_json()
    assert Manifest.from_json(written, where="m").record == record
    doc = json.loads(written)
    doc["record"] = ["not", "a", "record"]
    assert Manifest.from_json(json.dumps(doc).encode(), where="m").record is None
    del doc["record"]  # a checkpoint written before the record: still valid
    assert Manifest.from_json(json.dumps(doc).encode(), where="m").step == 7


def test_a_plain_pickle_is_refused_in_one_line_without_torchs_warning_before_it(tmp_path):
    import pickle
    import warnings

    folder = tmp_path / "step-00000003"
    plant_checkpoint(folder, {"w": torch.ones(2)})
    marker = tmp_path / "pwned"
    with open(folder / "state.pt", "wb") as f:  # pickle's own protocol 4, not torch.save's
        pickle.dump({"x": RunsACommand(f"touch {marker}")}, f, protocol=4)
    data = (folder / "state.pt").read_bytes()
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][0].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(UnsafeCheckpointError, match="refusing to load"):
            CheckpointManager(str(tmp_path)).load(str(folder))
    assert [str(w.message) for w in caught] == []
    assert not marker.exists()
