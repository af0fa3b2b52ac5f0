from __future__ import annotations

import pytest

from thrifty.config import TrainConfig, load_config, parse_duration
from thrifty.errors import ConfigError


def build(**sections):
    sections.setdefault("run", {"max_steps": 10})
    return TrainConfig.from_dict(sections)


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"batch": {"micro": 0}}, r"batch\.micro = 0 is invalid: must be greater than 0"),
        ({"batch": {"micro": -3}}, r"batch\.micro = -3 is invalid"),
        (
            {"batch": {"micro": 8, "effective": 20}},
            r"batch\.effective = 20 is invalid: must be a multiple of batch\.micro = 8",
        ),
        ({"batch": {"micro": "8"}}, r"batch\.micro = '8' is invalid: expected an integer"),
        ({"batch": {"micro": 8.0}}, r"batch\.micro = 8\.0 is invalid: expected an integer"),
        (
            {"batch": {"micr0": 8}},
            r"unknown key batch\.micr0 in batch: did you mean batch\.micro\?",
        ),
        ({"batchh": {}}, r"unknown key batchh in the config: did you mean batch\?"),
        (
            {"precision": {"mode": "bf17"}},
            r"precision\.mode = 'bf17' is invalid: expected 'auto' \| 'bf16' \| 'fp16' \| 'fp32'",
        ),
        (
            {"precision": {"allow_tf32": "yes"}},
            r"precision\.allow_tf32 = 'yes' is invalid: expected true or false",
        ),
        ({"optimizer": {"lr": -1.0}}, r"optimizer\.lr = -1\.0 is invalid: must be greater than 0"),
        ({"optimizer": {"betas": [0.9]}}, r"optimizer\.betas = \[0\.9\] is invalid"),
        (
            {"activation_checkpointing": {"policy": "sometimes"}},
            r"activation_checkpointing\.policy = 'sometimes' is invalid: use off, every_other",
        ),
        (
            {"data": {"num_workers": "many"}},
            r"data\.num_workers = 'many' is invalid: expected an integer or 'auto'",
        ),
        ({"run": {"max_steps": 0}}, r"run\.max_steps = 0 is invalid"),
        ({"run": {}}, r"run has no budget: set at least one of run\.max_steps"),
        ({"run": {"max_time": "soon"}}, r"run\.max_time = 'soon' is invalid"),
        (
            {"task": {"model": "not a path"}},
            r"task\.model = 'not a path' is invalid: use an import path",
        ),
        ({"compile": {"mode": "fast"}}, r"compile\.mode = 'fast' is invalid"),
    ],
)
def test_each_invalid_value_names_field_value_and_what_is_allowed(sections, message):
    with pytest.raises(ConfigError, match=message):
        build(**sections)


def test_toml_file_with_overrides(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(
        '[run]\nmax_steps = 10\n[batch]\nmicro = 4\neffective = 16\n[precision]\nmode = "fp32"\n'
    )
    config = load_config(
        path, [("batch.micro", "8"), ("precision.mode", "bf16"), ("run.max_time", "30m")]
    )
    assert config.batch.micro == 8 and config.batch.effective == 16
    assert config.precision.mode == "bf16"
    assert config.run.max_seconds == 1800
    assert config.batch.accumulation_steps() == 2


def test_override_with_an_unknown_key_is_an_error(tmp_path):
    with pytest.raises(
        ConfigError, match=r"unknown key batch\.mcro in batch: did you mean batch\.micro\?"
    ):
        load_config(None, [("run.max_steps", "5"), ("batch.mcro", "8")])


def test_invalid_toml_names_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[run\nmax_steps = 1\n")
    with pytest.raises(ConfigError, match="bad.toml is not valid TOML"):
        load_config(path)


def test_written_config_reads_back_the_same(tmp_path):
    from thrifty.config import dump_toml

    config = build(
        batch={"micro": 4, "effective": 8},
        activation_checkpointing={"policy": ["blocks.*"]},
        task={"model": "m:f", "model_args": {"width": 3}},
    )
    path = tmp_path / "config.toml"
    path.write_text(dump_toml(config.to_dict()))
    assert load_config(path) == config


def test_accumulation_must_divide_across_processes():
    config = build(batch={"micro": 4, "effective": 16})
    assert config.batch.accumulation_steps(world_size=2) == 2
    with pytest.raises(ConfigError, match=r"multiple of batch\.micro × world size = 4 × 3 = 12"):
        config.batch.accumulation_steps(world_size=3)


@pytest.mark.parametrize(
    ("text", "seconds"), [(90, 90.0), ("90s", 90.0), ("30m", 1800.0), ("2.5h", 9000.0)]
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds
