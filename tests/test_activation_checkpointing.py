from __future__ import annotations

import pytest
import torch

from helpers import tiny_gpt
from thrifty.demo import DEMO_CONFIG, build_model
from thrifty.levers.activation_checkpointing import (
    apply_activation_checkpointing,
    find_repeated_blocks,
    parse_policy,
    remove_activation_checkpointing,
)


def saved_bytes(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> int:
    """Bytes autograd keeps for backward during one forward, each storage counted once."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(**batch)
    loss.backward()
    return sum(storages.values())


def demo_batch(micro: int = 8) -> dict[str, torch.Tensor]:
    block = DEMO_CONFIG["task"]["model_args"]["block_size"]
    x = torch.randint(0, 256, (micro, block + 1), generator=torch.Generator().manual_seed(0))
    return {"input_ids": x[:, :-1], "targets": x[:, 1:]}


def test_finds_the_transformer_blocks_as_the_repeated_modules():
    model = tiny_gpt(n_layer=4)
    assert find_repeated_blocks(model) == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("every_other", ["blocks.0", "blocks.2"]),
        ("all", ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]),
        ("every_nth:3", ["blocks.0", "blocks.3"]),
        (["blocks.1", "blocks.3*"], ["blocks.1", "blocks.3"]),
        ("off", []),
    ],
)
def test_policy_selects_the_blocks_it_names(policy, expected):
    assert apply_activation_checkpointing(tiny_gpt(), policy) == expected


def test_state_dict_keys_are_unchanged_so_checkpoints_load_either_way():
    plain = tiny_gpt()
    wrapped = tiny_gpt()
    apply_activation_checkpointing(wrapped, "all")
    assert list(wrapped.state_dict()) == list(plain.state_dict())


def test_gradients_equal_the_unwrapped_models_with_dropout():
    batch = demo_batch(4)
    batch = {k: v[:, :32] for k, v in batch.items()}
    grads = {}
    for policy in ("off", "all"):
        model = tiny_gpt(dropout=0.2)
        apply_activation_checkpointing(model, policy)
        torch.manual_seed(123)  # same dropout masks in both forwards
        model(**batch).backward()
        grads[policy] = [p.grad.clone() for p in model.parameters()]
    for plain, recomputed in zip(grads["off"], grads["all"], strict=True):
        torch.testing.assert_close(recomputed, plain, rtol=0, atol=0)


def test_saved_activation_bytes_fall_on_the_demo_model():
    batch = demo_batch()
    sizes = {}
    for policy in ("off", "every_other", "all"):
        torch.manual_seed(0)
        model = build_model(**DEMO_CONFIG["task"]["model_args"])
        apply_activation_checkpointing(model, policy)
        sizes[policy] = saved_bytes(model, batch)
    every_other = sizes["every_other"] / sizes["off"]
    all_ = sizes["all"] / sizes["off"]
    print(
        f"saved for backward: off {sizes['off']:,} B, every_other {every_other:.1%}, all {all_:.1%}"
    )
    assert every_other <= 0.65
    assert all_ <= 0.35


def test_remove_restores_the_plain_forward():
    model = tiny_gpt()
    apply_activation_checkpointing(model, "all")
    remove_activation_checkpointing(model)
    assert all("forward" not in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("bad", ["sometimes", "every_nth:0", [], [""]])
def test_bad_policies_say_what_is_allowed(bad):
    with pytest.raises(ValueError, match="every_other|pattern"):
        parse_policy(bad)


def test_patterns_that_match_nothing_are_an_error():
    with pytest.raises(ValueError, match="matches no module"):
        apply_activation_checkpointing(tiny_gpt(), ["decoder.*"])


def test_model_without_repeated_blocks_is_an_error():
    with pytest.raises(ValueError, match="no repeated blocks"):
        apply_activation_checkpointing(torch.nn.Linear(2, 2), "all")


def test_the_set_up_line_counts_its_blocks_in_words(caplog):
    import logging
    from types import SimpleNamespace

    from thrifty.levers.precision import Precision
    from thrifty.reporting.end_of_run import log_setup

    caplog.set_level(logging.INFO, logger="thrifty")
    single = SimpleNamespace(enabled=False, world_size=1)
    fp32 = Precision("fp32", "cpu", "requested")
    log_setup(single, fp32, ["blocks.0"], micro=8, accumulation=1)
    log_setup(single, fp32, ["blocks.0", "blocks.1"], micro=8, accumulation=1)
    lines = [r.getMessage() for r in caplog.records if "activation checkpointing" in r.getMessage()]
    assert lines == [
        "activation checkpointing: 1 block (blocks.0)",
        "activation checkpointing: 2 blocks (blocks.0, blocks.1)",
    ]
