"""One run's life: its directory and lock, when and what to save, resume, preemption,
the guard against divergence and the forecast."""
