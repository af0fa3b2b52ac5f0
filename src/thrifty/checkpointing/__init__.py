"""Checkpointing: the store (`store/`: local and fsspec storage, the manifest, asynchronous
save, retention, DCP shards) and a run's saves (`saving/`: opening a run to resume it or start
it fresh, the checkpointer, where saves go, the preemption watcher, RNG and schedule state)."""
