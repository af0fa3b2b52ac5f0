"""A run's saves: opening a run (resume or a fresh start), the checkpointer with its stateful
parts as one versioned dict, where saves go, the preemption watcher, RNG and schedule state,
and folders shared between jobs. It stands on the store (`thrifty.checkpointing.store`) and
the run directory (`thrifty.rundir`)."""
