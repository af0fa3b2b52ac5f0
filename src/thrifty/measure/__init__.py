"""See where the time and money go: FLOPs and MFU, system sampling, diagnosis, cost.

Importing this package is cheap: torch, psutil and pynvml load only when a piece that needs
them is used (`cost` and `diagnosis` need none of them).

    >>> from thrifty.measure import count_flops, peak_flops, diagnose, Evidence, CostMeter
"""

from __future__ import annotations

from thrifty.lazy import lazy_exports

_EXPORTS = {
    "FlopCount": "thrifty.measure.flops",
    "count_flops": "thrifty.measure.flops",
    "transformer_flops_per_token": "thrifty.measure.flops",
    "mfu": "thrifty.measure.flops",
    "Peak": "thrifty.measure.peak",
    "peak_flops": "thrifty.measure.peak",
    "match_gpu": "thrifty.measure.peak",
    "measure_cpu_peak": "thrifty.measure.peak",
    "bf16_speedup": "thrifty.measure.peak",
    "SystemSampler": "thrifty.measure.system",
    "Evidence": "thrifty.measure.diagnosis",
    "LeverMeasurement": "thrifty.measure.diagnosis",
    "Diagnosis": "thrifty.measure.diagnosis",
    "Recommendation": "thrifty.measure.diagnosis",
    "diagnose": "thrifty.measure.diagnosis",
    "BOTTLENECKS": "thrifty.measure.diagnosis",
    "CostConfig": "thrifty.measure.cost",
    "CostMeter": "thrifty.measure.cost",
    "CostSnapshot": "thrifty.measure.cost",
    "CostProjection": "thrifty.measure.cost",
    "CostSummary": "thrifty.measure.cost",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
