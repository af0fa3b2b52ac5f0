"""thrifty: make PyTorch training cost less.

Importing thrifty is cheap: the training pieces (and torch) load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Trainer": "thrifty.trainer",
    "FitResult": "thrifty.trainer",
    "TrainConfig": "thrifty.config",
    "load_config": "thrifty.config",
    "RunConfig": "thrifty.config",
    "PrecisionConfig": "thrifty.config",
    "ActivationCheckpointingConfig": "thrifty.config",
    "BatchConfig": "thrifty.config",
    "OptimizerConfig": "thrifty.config",
    "ScheduleConfig": "thrifty.config",
    "DataConfig": "thrifty.config",
    "CompileConfig": "thrifty.config",
    "EvalConfig": "thrifty.config",
    "EarlyStoppingConfig": "thrifty.config",
    "TaskConfig": "thrifty.config",
    "apply_activation_checkpointing": "thrifty.activation_checkpointing",
    "find_repeated_blocks": "thrifty.activation_checkpointing",
    "resolve_precision": "thrifty.precision",
    "loss_weights": "thrifty.batches",
    "scaled_lr": "thrifty.schedule",
    "lr_multiplier": "thrifty.schedule",
    "build_scheduler": "thrifty.schedule",
    "choose_num_workers": "thrifty.loading",
    "build_loader": "thrifty.loading",
    "EpochSampler": "thrifty.loading",
    "LoaderSettings": "thrifty.loading",
    "EarlyStopping": "thrifty.early_stopping",
    "ThriftyError": "thrifty.errors",
    "ConfigError": "thrifty.errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'thrifty' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
