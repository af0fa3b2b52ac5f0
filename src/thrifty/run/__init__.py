"""The loop: the Trainer (`trainer.py`) and its set-up (`setup.py`), one optimizer step
(`step.py`), evaluation, the checks of its inputs, and the task a config's `[task]` names."""
