"""The run directory: its lock, lease and holders, which files thrifty wrote and so may replace
(`own_files.py`, `ownership.py`), its files (metrics.jsonl, summary.json: `files.py`), and what
a config changed between runs means to a resume (`config_changes.py`)."""
