"""The cost levers, one module each: precision, activation checkpointing, gradient
accumulation, data loading, the learning-rate schedule, early stopping."""
