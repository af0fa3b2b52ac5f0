"""A tiny command-line job and what "left as it was" compares, for the run directory tests."""

from __future__ import annotations

from pathlib import Path

from thrifty.cli import main


def job(tmp_path: Path, steps: int = 3) -> Path:
    """A TOML job training a tiny demo GPT for `steps` steps."""
    config = tmp_path / "job.toml"
    config.write_text(
        f'[run]\nmax_steps = {steps}\nlog_every = 1\nprogress = "off"\n'
        '[batch]\nmicro = 4\n[data]\nnum_workers = 0\n[schedule]\ndecay = "constant"\n'
        '[checkpoint]\nevery = "off"\n[spot]\nprovider = "none"\n[log]\nreport = true\n'
        '[task]\nmodel = "thrifty.demo:build_model"\ntrain_data = "thrifty.demo:train_dataset"\n'
        "model_args = { n_layer = 1, n_head = 2, n_embd = 16, block_size = 16 }\n"
        "data_args = { block_size = 16, max_bytes = 20000 }\n"
    )
    return config


def train(capsys, config: Path, out: Path, *args: str) -> tuple[int, str]:
    code = main(["train", str(config), "--out", str(out), *args])
    return code, capsys.readouterr().err


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` and each file's bytes: what "left as it was" compares."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
        for p in sorted(folder.rglob("*"))
    }
