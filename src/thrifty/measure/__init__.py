"""See where the time and money go: FLOPs and MFU, system sampling, diagnosis, cost.

Importing this package is cheap: torch, psutil and pynvml load only when a piece that needs
them is used (`cost` and `diagnosis` need none of them).

    >>> from thrifty.measure import count_flops, peak_flops, diagnose, Evidence, CostMeter
"""

from __future__ import annotations

from thrifty.lazy import lazy_exports

_EXPORTS = {  # module: the names it lends the package
    "thrifty.measure.flops": "FlopCount count_flops transformer_flops_per_token mfu",
    "thrifty.measure.peak": "Peak peak_flops match_gpu measure_cpu_peak bf16_speedup",
    "thrifty.measure.system": "SystemSampler",
    "thrifty.measure.diagnosis": (
        "Evidence LeverMeasurement Diagnosis Recommendation diagnose BOTTLENECKS"
    ),
    "thrifty.measure.cost": "CostConfig CostMeter CostSnapshot CostProjection CostSummary",
}

__all__ = sorted(name for names in _EXPORTS.values() for name in names.split())

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
