"""thrifty inside the trainer you already have.

- `thrifty.integrations.transformers`: `fit(trainer, config=...)` in place of
  `trainer.train()` for a Hugging Face `Trainer`, and its `ThriftyCallback`.
- `thrifty.integrations.lightning`: `fit(trainer, model, ..., config=...)` in place of
  `trainer.fit(model, ...)` for Lightning, and its `ThriftyCallback`.

Each brings spot safety (a stop signal or a cloud notice saves a checkpoint through the
framework's own save at the next step boundary, and the process exits 75; the same command
resumes from the newest complete checkpoint), the cost meter and the run's record in a
`thrifty/` folder of the framework's output directory (so `thrifty runs` and `thrifty report`
list these runs), and stops for a run that cannot reach its target or whose loss is not
finite. The frameworks are imported only by the module that serves them (`pip install
'thrifty[transformers]'` or `'thrifty[lightning]'`); the shared part is
`thrifty.integrations.session`.
"""
