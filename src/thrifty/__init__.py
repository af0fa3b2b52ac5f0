"""thrifty: make PyTorch training cost less.

Importing thrifty is cheap: the training pieces (and torch) load on first use.
"""

from __future__ import annotations

from thrifty.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {  # module: the names it lends the package
    "thrifty.run.trainer": "Trainer FitResult",
    "thrifty.config": (
        "TrainConfig load_config RunConfig PrecisionConfig ActivationCheckpointingConfig "
        "BatchConfig OptimizerConfig ScheduleConfig DataConfig CompileConfig EvalConfig "
        "EarlyStoppingConfig TaskConfig"
    ),
    "thrifty.levers.activation_checkpointing": (
        "apply_activation_checkpointing find_repeated_blocks"
    ),
    "thrifty.levers.precision": "resolve_precision",
    "thrifty.levers.accumulation": "loss_weights",
    "thrifty.levers.schedule": "scaled_lr lr_multiplier build_scheduler",
    "thrifty.data.loading": "choose_num_workers build_loader EpochSampler LoaderSettings",
    "thrifty.levers.early_stopping": "EarlyStopping",
    "thrifty.search.tune": "tune",
    "thrifty.search.sweep": "sweep",
    "thrifty.errors": "ThriftyError ConfigError DataSourceError",
}

__all__ = sorted(name for names in _EXPORTS.values() for name in names.split()) + ["__version__"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
