"""The pieces of distributed training that need no process group."""

from __future__ import annotations

import io
import json
import pickle

import pytest
import torch

from thrifty.checkpointing.store.errors import CorruptCheckpointError, UnsafeCheckpointError
from thrifty.checkpointing.store.manifest import Manifest
from thrifty.checkpointing.store.sharded import merge_tensors, read_metadata_safely, split_tensors
from thrifty.config import DistributedConfig, TrainConfig, flatten_keys
from thrifty.data.sampling import EpochSampler
from thrifty.errors import ConfigError
from thrifty.levers.accumulation import loss_weights
from thrifty.strategies.launcher import _exit_code, strip_nprocs
from thrifty.strategies.process_group import Distributed, init_distributed


def test_split_keeps_tensors_for_shards_and_plain_values_for_state_pt():
    t = torch.ones(2)
    tree = {
        "model": {"w": t},
        "optimizer": {
            "state": {"w": {"step": t, "momentum_buffer": None}, "b": {}},
            "param_groups": [{"lr": 0.1, "params": ["w"]}],
        },
    }
    tensors, rest = split_tensors(tree)
    assert tensors == {"model": {"w": t}, "optimizer": {"state": {"w": {"step": t}}}}
    assert rest == {
        "optimizer": {
            "state": {"w": {"momentum_buffer": None}, "b": {}},
            "param_groups": [{"lr": 0.1, "params": ["w"]}],
        }
    }
    assert merge_tensors(tensors, rest) == tree


def _pickled(obj) -> bytes:
    return pickle.dumps(obj)


class _Boom:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_the_shard_index_is_unpickled_only_with_an_allow_list(tmp_path, capsys):
    path = tmp_path / ".metadata"
    path.write_bytes(_pickled({"x": _Boom()}))
    with pytest.raises(UnsafeCheckpointError, match="builtins.print is not allowed"):
        read_metadata_safely(str(path))
    assert "never run" not in capsys.readouterr().out
    path.write_bytes(b"not a pickle")
    with pytest.raises(CorruptCheckpointError):
        read_metadata_safely(str(path))


def test_a_shard_index_that_would_unpickle_stored_objects_is_refused(tmp_path):
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata

    path = tmp_path / ".metadata"
    path.write_bytes(_pickled(Metadata(state_dict_metadata={"extra": BytesStorageMetadata()})))
    with pytest.raises(UnsafeCheckpointError, match="stores pickled objects"):
        read_metadata_safely(str(path))


def test_manifests_admit_shard_files_but_no_path_that_leaves_the_folder():
    doc = json.loads(Manifest(3, (), "2026-01-01T00:00:00Z", None, "0", "2").to_json())
    for name, allowed in [
        ("shards/__0_0.distcp", True),
        ("shards/.metadata", True),
        ("state.pt", True),
        ("../state.pt", False),
        ("shards/..", False),
        ("a/b/c", False),
        ("/etc/passwd", False),
    ]:
        doc["files"] = [{"name": name, "size": 1, "sha256": "0" * 64}]
        data = json.dumps(doc).encode()
        if allowed:
            assert Manifest.from_json(data, where="x").files[0].name == name
        else:
            with pytest.raises(CorruptCheckpointError):
                Manifest.from_json(data, where="x")


def test_loss_weights_over_ranks_average_to_the_global_mean():
    # Rank 0 holds 3 + 1 tokens, rank 1 holds 4 + 0: the window has 8 tokens in all.
    windows = [
        [{"loss_mask": torch.ones(3)}, {"loss_mask": torch.tensor([1.0, 0, 0])}],
        [{"loss_mask": torch.ones(4)}, {"loss_mask": torch.zeros(2)}],
    ]
    weights = [loss_weights(w, "tokens", totals=(4, 8), world_size=2) for w in windows]
    # DDP averages the ranks' gradients: (sum of weight × batch mean) / 2 = global token mean.
    assert [[w / 2 for w in ws] for ws in weights] == [[3 / 8, 1 / 8], [4 / 8, 0.0]]
    assert loss_weights(windows[0], "tokens") == [3 / 4, 1 / 4]  # one process: unchanged


def test_ranks_micro_batches_together_are_the_single_process_micro_batches():
    single = list(EpochSampler(100, seed=3))
    ranks = [list(EpochSampler(100, seed=3, rank=r, world_size=2)) for r in (0, 1)]
    micro = 8
    for i in range(100 // (2 * micro)):
        together = ranks[0][i * micro : (i + 1) * micro] + ranks[1][i * micro : (i + 1) * micro]
        assert sorted(together) == sorted(single[2 * i * micro : 2 * (i + 1) * micro])


def test_without_torchrun_it_is_one_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    d, device = init_distributed(DistributedConfig(strategy="ddp"), "cpu")
    assert (d.strategy, d.world_size, d.enabled, device) == ("single", 1, False, "cpu")
    # Every collective is then the identity and costs nothing.
    assert d.sum_ints([3, 4]) == [3, 4] and d.any_of(True, False) == [True, False]
    assert d.on_main(lambda: 5) == 5 and d.gather("x") == ["x"]


def test_the_global_batch_must_divide_by_the_world_size():
    config = TrainConfig.from_dict(
        {"run": {"max_steps": 1}, "batch": {"micro": 8, "effective": 48}}
    )
    assert config.batch.accumulation_steps(1) == 6
    assert config.batch.accumulation_steps(2) == 3
    with pytest.raises(ConfigError, match=r"8 × 4 = 32"):
        config.batch.accumulation_steps(4)


def test_config_differences_are_found_by_dotted_key():
    flat = flatten_keys({"batch": {"micro": 8}, "task": {"model_args": {}}})
    assert flat == {"batch.micro": 8, "task.model_args": {}}


def test_nprocs_is_removed_from_the_command_the_ranks_run():
    argv = ["train", "c.toml", "--nprocs", "2", "--set", "a.b=1", "--nprocs=4"]
    assert strip_nprocs(argv) == ["train", "c.toml", "--set", "a.b=1"]


def test_the_job_ends_with_the_code_of_the_rank_that_ended_first(capsys):
    # Rank 1 left preempted; the launcher then stopped rank 0 with SIGTERM.
    assert _exit_code({0: -15, 1: 75}, first=1) == 75
    assert _exit_code({0: 2, 1: 2}, first=0) == 2
    assert _exit_code({0: 1, 1: -15}, first=0) == 1
    assert "rank 0 ended with exit code 1" in capsys.readouterr().err


def test_a_bad_timeout_is_one_line():
    with pytest.raises(ConfigError, match="distributed.timeout"):
        DistributedConfig(timeout="soon")
    assert DistributedConfig(timeout="90s").timeout_seconds == 90


def test_describe_names_the_strategy_and_the_rank():
    d = Distributed(strategy="fsdp", rank=1, world_size=4, backend="nccl")
    assert d.describe() == "distributed: fsdp over 4 processes (nccl; this is rank 1)"


def test_unpickling_metadata_refuses_io_tricks(tmp_path):
    path = tmp_path / ".metadata"
    buffer = io.BytesIO()
    pickle.dump(torch.nn.Linear, buffer)  # a class outside the allow-list
    path.write_bytes(buffer.getvalue())
    with pytest.raises(UnsafeCheckpointError, match="torch.nn.modules.linear.Linear"):
        read_metadata_safely(str(path))


def test_a_rank_killed_outright_whose_survivors_can_resume_ends_the_job_resumable(capsys):
    # Rank 1 was SIGKILLed (a lost machine); rank 0 found it gone and exited 75 (a checkpoint
    # exists): run the job again.
    assert _exit_code({0: 75, 1: -9}, first=1) == 75
    # Rank 0 had nothing to resume from: the job failed.
    assert _exit_code({0: 1, 1: -9}, first=1) == 1
    assert "rank 1 ended with signal 9" in capsys.readouterr().err
