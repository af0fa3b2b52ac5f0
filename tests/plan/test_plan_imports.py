"""Importing the planner stays cheap: no torch, no rich, no matplotlib."""

from __future__ import annotations

import subprocess
import sys


def test_importing_thrifty_plan_loads_neither_torch_nor_rich_nor_matplotlib() -> None:
    code = (
        "import sys, thrifty.plan, thrifty.commands.plan, thrifty.commands.prices; "
        "from thrifty.plan import estimate, chinchilla, memory, scaling, checkpoint_interval; "
        "from thrifty.plan import load_catalog; "
        "print(sorted(m for m in ('torch', 'rich', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
