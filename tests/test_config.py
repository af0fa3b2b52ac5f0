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


# --------------------------------------------------------------------------------------------
# config.toml round-trips: a seeded generator of valid configs with awkward values

ODD_CHARS = ["a", "Z", "0", " ", ".", "=", "#", "[", "]", '"', "'", "\\", "\n", "\t", "\r"]
ODD_CHARS += ["\x00", "\x1f", "\x7f", "é", "日本", "😀", "\u2028", "-", "_", "{", "}", ","]


def odd_string(rng, min_len=0):
    return "".join(rng.choice(ODD_CHARS) for _ in range(rng.randint(min_len, 8)))


def odd_float(rng):
    return rng.choice([1e-8, 0.1, 1e300, 5e-324, 0.0, -2.5, 3.0, rng.uniform(-1e6, 1e6)])


def odd_scalar(rng):
    kind = rng.randrange(5)
    if kind == 0:
        return odd_string(rng)
    if kind == 1:
        return rng.randint(-(2**63), 2**63 - 1)
    if kind == 2:
        return odd_float(rng)
    if kind == 3:
        return rng.random() < 0.5
    # TOML arrays may mix types; a list of one kind is the common case
    return [odd_string(rng) for _ in range(rng.randint(0, 3))]


def odd_table(rng, depth=0):
    table = {}
    for _ in range(rng.randint(0, 4)):
        key = rng.choice(["a.b", "with space", "x", "", "1", "dotted.key.here"]) + odd_string(rng)
        nested = depth < 2 and rng.random() < 0.25
        table[key] = odd_table(rng, depth + 1) if nested else odd_scalar(rng)
    return table


def random_config(rng) -> TrainConfig:
    micro = rng.randint(1, 64)
    sections = {
        "run": {
            "name": odd_string(rng, 1),
            "out": odd_string(rng, 1),
            "seed": rng.randint(-(2**31), 2**31),
            "max_steps": rng.randint(1, 10**9),
            "max_time": rng.choice(["30m", "2.5h", 90, 1e-8]),
            "deterministic": rng.random() < 0.5,
            "progress": rng.choice(["auto", "on", "off"]),
        },
        "batch": {"micro": micro, "effective": micro * rng.randint(1, 8)},
        "optimizer": {
            "lr": rng.choice([1e-8, 3e-4, 0.1, 12.0]),
            "betas": [rng.random() * 0.99, rng.random() * 0.99],
            "weight_decay": rng.choice([0.0, 1e-8, 0.1]),
        },
        "schedule": {"warmup_steps": rng.randint(0, 1000), "min_lr_ratio": rng.random()},
        "activation_checkpointing": {"policy": rng.choice(["off", "all", ["blocks.*", "h.[0-3]"]])},
        "checkpoint": {
            "location": odd_string(rng, 1),
            "every": rng.choice(["auto", "off", "10m", rng.randint(1, 1000)]),
            "storage_options": odd_table(rng),
        },
        "task": {
            "model": "pkg.mod:factory",
            "model_args": odd_table(rng),
            "data_args": odd_table(rng),
        },
        "measure": {"sample_seconds": rng.choice([1e-8, 0.5, 2.0])},
    }
    return TrainConfig.from_dict(sections)


def test_any_valid_config_written_as_toml_reads_back_equal(tmp_path):
    import random

    from thrifty.config import dump_toml

    rng = random.Random(20240601)
    path = tmp_path / "config.toml"
    for _ in range(300):
        config = random_config(rng)
        path.write_text(dump_toml(config.to_dict()), encoding="utf-8")
        assert load_config(path) == config, path.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "model_args",
    [
        {"a.b": 1},  # a dotted key is one key, not a nested table
        {"with space": "x"},
        {"text": 'line one\nline "two" \\ three'},
        {"nested": {"a.b": {"c d": [1, 2]}}},
    ],
)
def test_keys_and_strings_toml_cannot_write_bare_read_back_as_written(tmp_path, model_args):
    from thrifty.config import dump_toml

    config = build(task={"model": "m:f", "model_args": model_args})
    path = tmp_path / "config.toml"
    path.write_text(dump_toml(config.to_dict()), encoding="utf-8")
    assert load_config(path).task.model_args == model_args


def test_the_config_changes_history_in_config_toml_is_not_a_setting(tmp_path):
    from thrifty.config import dump_toml

    config = build(optimizer={"lr": 0.01})
    history = [{"step": 5, "key": "optimizer.lr", "kind": "optimization", "old": 3e-4, "new": 0.01}]
    path = tmp_path / "config.toml"
    path.write_text(dump_toml({**config.to_dict(), "config_changes": history}))
    assert load_config(path) == config


def test_allow_config_change_is_a_run_setting():
    assert build().run.allow_config_change is False
    assert build(run={"max_steps": 1, "allow_config_change": True}).run.allow_config_change


def test_an_optional_text_set_to_false_is_left_unset_as_an_empty_one_is():
    from thrifty.config import apply_overrides, parse_set_args

    for text in ("log.mlflow=false", 'log.mlflow=""'):
        data = apply_overrides({"run": {"max_steps": 1}}, parse_set_args([text]))
        assert not TrainConfig.from_dict(data).log.mlflow
    data = apply_overrides({"run": {"max_steps": 1}}, parse_set_args(["log.mlflow=file:./ml"]))
    assert TrainConfig.from_dict(data).log.mlflow == "file:./ml"
    with pytest.raises(ConfigError, match="log.mlflow = True is invalid: expected a string"):
        TrainConfig.from_dict({"run": {"max_steps": 1}, "log": {"mlflow": True}})
