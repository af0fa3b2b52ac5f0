"""The search: `tune/` chooses the cheapest way to train a job (`thrifty tune`), `sweep/` the
fewest runs to find good hyperparameters (`thrifty sweep`, on Optuna). Their trials run one
after another in warm worker processes (`engine`, `thrifty.worker`) and report through
`thrifty.callbacks.trial_report`."""
