"""thrifty: make PyTorch training cost less.

Importing thrifty is cheap: the training pieces (and torch) load on first use.
"""

from __future__ import annotations

from thrifty.lazy import lazy_exports

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
    "apply_activation_checkpointing": "thrifty.levers.activation_checkpointing",
    "find_repeated_blocks": "thrifty.levers.activation_checkpointing",
    "resolve_precision": "thrifty.levers.precision",
    "loss_weights": "thrifty.levers.accumulation",
    "scaled_lr": "thrifty.levers.schedule",
    "lr_multiplier": "thrifty.levers.schedule",
    "build_scheduler": "thrifty.levers.schedule",
    "choose_num_workers": "thrifty.data.loading",
    "build_loader": "thrifty.data.loading",
    "EpochSampler": "thrifty.data.loading",
    "LoaderSettings": "thrifty.data.loading",
    "EarlyStopping": "thrifty.levers.early_stopping",
    "tune": "thrifty.tuning",
    "sweep": "thrifty.sweeps",
    "ThriftyError": "thrifty.errors",
    "ConfigError": "thrifty.errors",
    "DataSourceError": "thrifty.errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
