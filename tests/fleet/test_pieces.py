"""The pieces of `thrifty launch` on their own: GPU requests, time limits, the node agent's
rendezvous, and a cheap import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from thrifty.errors import ConfigError
from thrifty.fleet.agent import main as agent_main
from thrifty.fleet.job import parse_gpus
from thrifty.fleet.slurm import time_limit
from thrifty.plan.catalog import load_catalog


def request(text: str):
    catalog = load_catalog()
    return parse_gpus(text, [g.name for g in catalog.gpus.values()], catalog.gpu)


def test_a_gpu_request_resolves_catalog_aliases_and_defaults_to_one_gpu():
    assert request("h100:8").name == "H100-SXM" and request("h100:8").per_node == 8
    assert request("A100").name == "A100-SXM4-40GB" and request("A100").per_node == 1


@pytest.mark.parametrize(
    ("seconds", "slurm"), [(90, "0-00:02:00"), (86400, "1-00:00:00"), (100_000, "1-03:47:00")]
)
def test_time_limits_are_written_the_way_sbatch_reads_them(seconds, slurm):
    assert time_limit(seconds) == slurm


def test_a_job_on_several_nodes_needs_a_rendezvous_every_node_shares():
    from thrifty.strategies.launcher import Rendezvous

    with pytest.raises(ConfigError, match="a job on 2 nodes needs a rendezvous"):
        Rendezvous(nodes=2)
    assert Rendezvous(nodes=2, endpoint="head:29500", run_id="job-1").nodes == 2


def test_the_agent_without_a_command_is_one_line(capsys):
    code = agent_main(
        ["--nnodes", "1", "--nproc-per-node", "2", "--rdzv-endpoint", "h:1", "--rdzv-id", "x"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err == "thrifty: error: no thrifty command to run: end with -- train CONFIG.toml\n"


def test_registering_launch_and_writing_job_files_loads_no_torch():
    code = (
        "import sys, thrifty.cli, thrifty.fleet.job, thrifty.fleet.skypilot, thrifty.fleet.slurm; "
        "thrifty.cli.build_parser(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
