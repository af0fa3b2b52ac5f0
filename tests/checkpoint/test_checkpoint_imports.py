"""Reading a checkpoint's manifest stays cheap: no torch and no fsspec until tensors or a URL
are involved."""

from __future__ import annotations

import ast
import subprocess
import sys


def _loaded_after(code: str) -> list[str]:
    heavy = "('torch', 'fsspec')"
    probe = f"import sys; {code}; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return ast.literal_eval(out.stdout.strip())


def test_importing_the_manifest_reader_loads_neither_torch_nor_fsspec() -> None:
    code = "import thrifty.checkpointing.store.manifest; from thrifty.checkpointing.store import Manifest, step_dir"
    assert _loaded_after(code) == []


def test_importing_the_checkpoint_manager_loads_torch_but_not_fsspec() -> None:
    assert _loaded_after("from thrifty.checkpointing.store import CheckpointManager") == ["torch"]
