"""A job relaunched on another machine, its checkpoints in a real S3 API (moto's server on
loopback): one row with its parts summed, the bucket's bytes priced, and the lifecycle rule
applied to the bucket and read back."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from torch import nn

from test_guard_in_training import Linear, config, regression
from thrifty import Trainer
from thrifty.cli import main
from thrifty.ledger.book import read_ledger
from thrifty.ledger.lifecycle import expires
from thrifty.rundir.files import read_metrics

pytest.importorskip("moto.server")
pytest.importorskip("boto3")
pytest.importorskip("s3fs")

from checkpoint.s3_server import BUCKET, S3Server, options  # noqa: E402

PRICE = {"usd_per_gpu_hour": 3.0, "pricing": "spot", "on_demand_usd_per_gpu_hour": 9.0}
CROSS, LONELY = f"s3://{BUCKET}/jobs/cross", f"s3://{BUCKET}/jobs/lonely"


class StopAt(nn.Module):
    """The model, and a SIGTERM to this process on its `at`-th training forward: a spot
    reclaim seen from inside the loop."""

    def __init__(self, at: int | None) -> None:
        super().__init__()
        self.inner, self.at, self.calls = Linear(), at, 0

    def forward(self, *batch):
        if self.training:
            self.calls += 1
            if self.calls == self.at:
                os.kill(os.getpid(), signal.SIGTERM)
        return self.inner(*batch)


def train(out: Path, location: str, endpoint: str, at: int | None = None, **checkpoint):
    cfg = config(
        out, 30, cost=PRICE,
        checkpoint={"every": 5, "location": location, "storage_options": options(endpoint), **checkpoint},
    )  # fmt: skip
    return Trainer(StopAt(at), regression(400), cfg).fit()


def client(endpoint: str):
    import boto3

    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="testing",
        aws_secret_access_key="testing", region_name="us-east-1",
    )  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Machine A trains until its spot instance is reclaimed; its emergency upload (step 17)
    never lands (deleted here, as when a machine vanishes first); machine B, a fresh disk,
    resumes from the bucket's newest (step 15) and finishes. Another job keeps 4 checkpoints
    in the bucket and no run directory of it is given."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("AWS_")}
    server = S3Server()
    server.create_bucket(BUCKET)
    root = tmp_path_factory.mktemp("fleet")
    try:
        assert train(root / "a", CROSS, server.endpoint, at=17).stop_reason == "preempted"
        s3 = client(server.endpoint)
        for key in ("jobs/cross/step-00000017/manifest.json", "jobs/cross/step-00000017/state.pt"):
            s3.delete_object(Bucket=BUCKET, Key=key)
        assert train(root / "b", CROSS, server.endpoint).stop_reason == "max_steps"
        train(root / "lonely", LONELY, server.endpoint, keep_last=4)
        yield root, server
    finally:
        server.close()
        os.environ.update(saved)


def test_a_job_resumed_on_another_machine_is_one_row_its_parts_summed(fleet):
    root, server = fleet
    ledger = read_ledger(
        [str(root / "a"), str(root / "b")], storage_options=options(server.endpoint)
    )
    (job,) = ledger.jobs
    assert job.machines == 2 and job.state == "finished" and job.steps == 30
    rate = 3.0 / 3600
    a = [r for r in read_metrics(root / "a/metrics.jsonl") if "cost" in r]
    b_summary = json.loads((root / "b/summary.json").read_text())
    at_15 = next(r for r in a if r["step"] == 15)["cost"]["elapsed_seconds"]
    # Machine A: all it trained (steps 16-17 included) and its set-up, as its last record
    # says; machine B: its whole wall time, from the checkpoint it resumed (its summary).
    machine_a = (a[-1]["cost"]["elapsed_seconds"] + a[-1]["cost"]["overhead_seconds"]) * rate
    machine_b = b_summary["cost"]["usd"] - at_15 * rate
    assert job.usd == pytest.approx(machine_a + machine_b, rel=0.02)
    assert job.usd > b_summary["cost"]["usd"]  # B alone never saw A's steps 16-17
    assert job.wasted_usd == pytest.approx((a[-1]["cost"]["elapsed_seconds"] - at_15) * rate)
    assert sum(p.redone_steps for p in job.parts) == 2


def newest_record_usd(job: str = "lonely", endpoint: str = "") -> float:
    """What a job had paid at its newest checkpoint (step 30), as its manifest's record says:
    its training clock, the work thrown away and its wall time outside the clock."""
    key = f"jobs/{job}/step-00000030/manifest.json"
    body = client(endpoint).get_object(Bucket=BUCKET, Key=key)["Body"].read()
    record = json.loads(body)["record"]
    seconds = record["seconds"] + record["wasted_seconds"] + record["overhead_seconds"]
    return seconds * record["usd_per_hour"] / 3600


def env_for(monkeypatch, endpoint: str) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def test_the_bucket_gives_each_location_its_bytes_and_their_price_a_month(
    fleet, monkeypatch, capsys
):
    root, server = fleet
    env_for(monkeypatch, server.endpoint)
    assert main(["runs", str(root / "a"), str(root / "b"), f"s3://{BUCKET}/jobs", "--json"]) == 0
    runs = {r["location"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    listed = client(server.endpoint).list_objects_v2(Bucket=BUCKET, Prefix="jobs/")["Contents"]
    for url in (CROSS, LONELY):
        prefix = url.split(BUCKET + "/")[1] + "/"
        size = sum(o["Size"] for o in listed if o["Key"].startswith(prefix))
        assert runs[url]["storage_bytes"] == size > 0
        assert runs[url]["storage_usd_month"] == pytest.approx(size / 2**30 * 0.023)
    assert len(runs[CROSS]["machines"]) == 2  # the run directories and the bucket: one row
    assert runs[LONELY]["state"] == "in bucket"
    assert runs[LONELY]["checkpoints"] == [15, 20, 25, 30]
    # No run directory of it was given: its dollars come from its newest manifest's record,
    # written with the final checkpoint at the end of the run (the summary adds the upload
    # that followed).
    assert runs[LONELY]["usd"] == pytest.approx(newest_record_usd(endpoint=server.endpoint))
    lonely = json.loads((root / "lonely/summary.json").read_text())["cost"]
    assert runs[LONELY]["usd"] <= lonely["usd"]


def test_the_bucket_alone_gives_each_job_its_dollars_as_of_its_newest_checkpoint(
    fleet, monkeypatch, capsys
):
    """Only the bucket: the manifests' records, nothing downloaded but them. The relaunched
    job's newest checkpoint was written by machine B, whose meter went on from the checkpoint
    it resumed from (machine A's part up to it included): B's own figure, A's steps after
    that checkpoint being lost with A's disk."""
    root, server = fleet
    env_for(monkeypatch, server.endpoint)
    assert main(["runs", f"s3://{BUCKET}/jobs", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    runs = {r["location"]: r for r in out["runs"]}
    b = json.loads((root / "b/summary.json").read_text())["cost"]
    assert runs[CROSS]["usd"] == pytest.approx(newest_record_usd("cross", server.endpoint))
    assert runs[CROSS]["usd"] <= b["usd"]
    assert runs[CROSS]["pricing"] == "spot" and runs[CROSS]["on_demand_usd"] == pytest.approx(
        3 * runs[CROSS]["usd"]
    )
    assert out["total"]["usd"] == pytest.approx(runs[CROSS]["usd"] + runs[LONELY]["usd"])


def test_the_lifecycle_rule_read_back_from_the_bucket_expires_only_superseded_checkpoints(
    fleet, monkeypatch, capsys, tmp_path
):
    root, server = fleet
    env_for(monkeypatch, server.endpoint)
    assert main(["runs", f"s3://{BUCKET}/jobs", "--lifecycle", "7", "--out", str(tmp_path)]) == 0
    assert "aws s3api put-bucket-lifecycle-configuration" in capsys.readouterr().out
    written = json.loads((tmp_path / f"{BUCKET}.s3-lifecycle.json").read_text())
    s3 = client(server.endpoint)
    s3.put_bucket_lifecycle_configuration(Bucket=BUCKET, LifecycleConfiguration=written)
    rules = s3.get_bucket_lifecycle_configuration(Bucket=BUCKET)["Rules"]
    assert sorted((r["ID"], r["Filter"]["Prefix"]) for r in rules) == sorted(
        (r["ID"], r["Filter"]["Prefix"]) for r in written["Rules"]
    )
    assert all(r["Expiration"]["Days"] == 7 for r in rules if "Expiration" in r)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="jobs/")["Contents"]]
    expiring = sorted(k for k in keys if expires(rules, k))
    assert {k.rsplit("/", 1)[0] for k in expiring} == {
        "jobs/lonely/step-00000015", "jobs/lonely/step-00000020"
    }  # fmt: skip
    # The two newest of each job stay: the final model and the checkpoint before it.
    assert not any(expires(rules, k) for k in keys if "step-00000030" in k or "cross" in k)
    # Written again, the same file is refused unless --overwrite.
    assert main(["runs", f"s3://{BUCKET}/jobs", "--lifecycle", "7", "--out", str(tmp_path)]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_the_printed_lifecycle_command_keeps_an_out_folder_with_a_space_and_a_semicolon_one_word(
    fleet, monkeypatch, capsys, tmp_path
):
    import shlex
    import subprocess

    root, server = fleet
    env_for(monkeypatch, server.endpoint)
    out = tmp_path / "my rules; touch pwned"
    assert main(["runs", f"s3://{BUCKET}/jobs", "--lifecycle", "7", "--out", str(out)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "apply with " in x)
    command = line.split("apply with ", 1)[1]
    words = [
        "aws", "s3api", "put-bucket-lifecycle-configuration", "--bucket", BUCKET,
        "--lifecycle-configuration", f"file://{out}/{BUCKET}.s3-lifecycle.json",
    ]  # fmt: skip
    assert shlex.split(command) == words
    # A shell given the line sees those words and runs nothing after the `;`.
    shell = subprocess.run(
        ["sh", "-c", f"printf '%s\\n' {command}"], cwd=tmp_path, capture_output=True, text=True
    )
    assert shell.stdout.splitlines() == words and not (tmp_path / "pwned").exists()


def test_a_manifest_whose_record_is_damaged_is_skipped_in_one_line_and_the_rest_totalled(
    fleet, monkeypatch, capsys
):
    """A bucket shared with another team (or another version): a manifest whose cost record
    says `gpus = "many"`. Its record is left out with one line; the other job is totalled."""
    root, server = fleet
    env_for(monkeypatch, server.endpoint)
    s3 = client(server.endpoint)
    manifest = json.loads(
        s3.get_object(Bucket=BUCKET, Key="jobs/lonely/step-00000030/manifest.json")["Body"].read()
    )
    manifest["record"]["gpus"] = "many"
    other = "other-team/job/step-00000030"
    s3.put_object(Bucket=BUCKET, Key=f"{other}/state.pt", Body=b"weights")
    s3.put_object(Bucket=BUCKET, Key=f"{other}/manifest.json", Body=json.dumps(manifest))
    try:
        code = main(["runs", LONELY, f"s3://{BUCKET}/other-team", "--json"])
        out, err = capsys.readouterr()
    finally:
        for key in ("state.pt", "manifest.json"):
            s3.delete_object(Bucket=BUCKET, Key=f"{other}/{key}")
    assert code == 0
    assert err.strip() == (
        f"thrifty runs: s3://{BUCKET}/other-team/job/step-00000030/manifest.json: record.gpus is "
        "'many', not a whole number of GPUs, 1 or more: its cost record is skipped"
    )
    data = json.loads(out)
    runs = {r["location"]: r for r in data["runs"]}
    assert runs[LONELY]["usd"] == pytest.approx(newest_record_usd(endpoint=server.endpoint))
    assert runs[f"s3://{BUCKET}/other-team/job"]["usd"] is None
    assert data["total"]["usd"] == pytest.approx(runs[LONELY]["usd"])
