"""Importing the measurement pieces stays cheap: no psutil or pynvml until sampling starts,
and no torch for the cost meter and the diagnosis."""

from __future__ import annotations

import ast
import subprocess
import sys


def _loaded_after(code: str) -> list[str]:
    heavy = "('torch', 'psutil', 'pynvml')"
    probe = f"import sys; {code}; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return ast.literal_eval(out.stdout.strip())


def test_importing_measure_cost_diagnosis_and_system_loads_no_heavy_module() -> None:
    code = (
        "import thrifty.measure; "
        "from thrifty.measure import CostMeter, CostConfig, Evidence, diagnose, SystemSampler"
    )
    assert _loaded_after(code) == []


def test_importing_the_flop_counter_loads_torch_but_not_the_monitors() -> None:
    assert _loaded_after("from thrifty.measure import count_flops, peak_flops") == ["torch"]
