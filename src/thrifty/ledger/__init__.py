"""The team's ledger: every thrifty run under some folders (or in a bucket), one row a job.

A run directory is one machine's view of a job: what it trained, the seconds it was billed,
the work a preemption threw away, and what a stop before the budget saved. A job relaunched
on other machines (SkyPilot, Slurm) leaves one run directory on each; they share the
checkpoint location, which is how the ledger puts them back together as one row with their
costs summed. Beside compute, checkpoints kept in a bucket cost money every month: the ledger
counts their bytes and prices them from the catalog.

Cheap to import (no torch): `thrifty runs` and `thrifty report` read run directories only.

- `attempt`: one run directory read into an `Attempt` (records, price, state, what it saved).
- `finding`: the runs, sweeps and tunes under the folders given.
- `jobs`: attempts that share a checkpoint location joined into one `Job`, their dollars summed.
- `locations`: what a checkpoint location keeps (bytes, checkpoints, lease), and the
  locations under an s3:// or gs:// prefix, read from their listing and manifests.
- `book`: `read_ledger`, all of the above for the paths given, with tune savings.
- `groups`: totals, `--by month|config|sweep`, each row as data.
- `tables`: the ledger printed.
- `case_study`: the seeds' case-study table laid out from the team's own runs.
- `lifecycle`: the bucket lifecycle rules that expire superseded checkpoints.
"""

from __future__ import annotations
