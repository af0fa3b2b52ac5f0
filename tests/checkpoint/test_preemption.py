"""Preemption: signals and each cloud's notice endpoint (served on 127.0.0.1) raise one flag."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

import thrifty.checkpointing.saving.preemption as preemption
from thrifty.checkpointing.saving.preemption import (
    EXIT_PREEMPTED,
    AwsPoller,
    AzurePoller,
    GcpPoller,
    PreemptionWatcher,
    detect_provider,
    make_poller,
)
from thrifty.errors import ConfigError

TOKEN = "AQAEAFake-token=="
INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"
PREEMPTED = "/computeMetadata/v1/instance/preempted"
SCHEDULED_EVENTS = "/metadata/scheduledevents?api-version=2020-07-01"


def wait_until(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def serve_aws(server, *, action: dict | None = None, rebalance: dict | None = None) -> None:
    server.answer(
        "PUT",
        "/latest/api/token",
        200,
        TOKEN,
        require={"X-aws-ec2-metadata-token-ttl-seconds": "21600"},
    )
    token = {"X-aws-ec2-metadata-token": TOKEN}
    for path, doc in ((INSTANCE_ACTION, action), (REBALANCE, rebalance)):
        if doc is None:
            server.answer("GET", path, 404, "Not Found", require=token)
        else:
            server.answer("GET", path, 200, json.dumps(doc), require=token)


def test_the_exit_code_says_preempted_and_resumable():
    assert EXIT_PREEMPTED == 75  # sysexits EX_TEMPFAIL


def test_aws_poller_uses_the_imdsv2_token_and_sees_nothing_while_instance_action_is_404(
    metadata_server,
):
    serve_aws(metadata_server)
    poller = AwsPoller(metadata_server.url)
    assert poller.poll() is None
    assert poller.poll() is None
    methods = [(method, path) for method, path, _ in metadata_server.requests]
    assert methods[0] == ("PUT", "/latest/api/token")
    assert methods.count(("PUT", "/latest/api/token")) == 1  # the token is reused
    assert all(
        headers.get("X-aws-ec2-metadata-token") == TOKEN
        for method, _, headers in metadata_server.requests
        if method == "GET"
    )


def test_aws_poller_reports_a_pending_spot_instance_action(metadata_server):
    serve_aws(metadata_server, action={"action": "terminate", "time": "2017-09-18T08:22:00Z"})
    reason = AwsPoller(metadata_server.url).poll()
    assert reason == "AWS spot instance-action notice: terminate at 2017-09-18T08:22:00Z"


def test_aws_poller_reports_a_rebalance_recommendation(metadata_server):
    serve_aws(metadata_server, rebalance={"noticeTime": "2020-11-05T08:22:00Z"})
    reason = AwsPoller(metadata_server.url).poll()
    assert reason == "AWS rebalance recommendation at 2020-11-05T08:22:00Z"


def test_aws_poller_gets_a_new_token_when_the_old_one_is_refused(metadata_server):
    serve_aws(metadata_server)
    poller = AwsPoller(metadata_server.url)
    poller._token, poller._token_expires = "expired", time.monotonic() + 600
    assert poller.poll() is None
    assert [m for m, p, _ in metadata_server.requests].count("PUT") == 1


def test_gcp_poller_reads_preempted_and_sends_metadata_flavor(metadata_server):
    flavor = {"Metadata-Flavor": "Google"}
    metadata_server.answer("GET", PREEMPTED, 200, "FALSE", headers=flavor, require=flavor)
    poller = GcpPoller(metadata_server.url)
    assert poller.poll() is None
    metadata_server.answer("GET", PREEMPTED, 200, "TRUE", headers=flavor, require=flavor)
    assert poller.poll() == "GCP preemption notice (instance/preempted is TRUE)"


def test_gcp_poller_refuses_an_answer_without_the_metadata_flavor_header(metadata_server):
    metadata_server.answer("GET", PREEMPTED, 200, "TRUE")
    with pytest.raises(OSError, match="not the GCE metadata server"):
        GcpPoller(metadata_server.url).poll()


def test_azure_poller_reports_a_preempt_event_and_ignores_others(metadata_server):
    require = {"Metadata": "true"}
    event = {
        "EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
        "EventStatus": "Scheduled",
        "EventType": "Freeze",
        "ResourceType": "VirtualMachine",
        "Resources": ["vm1"],
        "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
    }
    doc = {"DocumentIncarnation": 1, "Events": [event]}
    metadata_server.answer_json("GET", SCHEDULED_EVENTS, doc, require=require)
    poller = AzurePoller(metadata_server.url)
    assert poller.poll() is None
    doc["Events"].append({**event, "EventType": "Preempt"})
    metadata_server.answer_json("GET", SCHEDULED_EVENTS, doc, require=require)
    assert poller.poll() == "Azure scheduled event Preempt not before Mon, 19 Sep 2016 18:29:47 GMT"


def test_the_watcher_raises_the_flag_when_a_notice_arrives(metadata_server):
    flavor = {"Metadata-Flavor": "Google"}
    metadata_server.answer("GET", PREEMPTED, 200, "FALSE", headers=flavor, require=flavor)
    watcher = PreemptionWatcher("gcp", base_url=metadata_server.url, poll_interval=0.02)
    with watcher:
        assert wait_until(lambda: len(metadata_server.requests) >= 2)
        assert watcher.requested is False
        metadata_server.answer("GET", PREEMPTED, 200, "TRUE", headers=flavor)
        assert wait_until(lambda: watcher.requested)
    assert "GCP preemption notice" in watcher.reason


def test_the_watcher_keeps_polling_through_metadata_errors(metadata_server):
    watcher = PreemptionWatcher("azure", base_url=metadata_server.url, poll_interval=0.02)
    with watcher:  # every request gets a 404 first
        assert wait_until(lambda: len(metadata_server.requests) >= 3)
        metadata_server.answer_json(
            "GET", SCHEDULED_EVENTS, {"Events": [{"EventType": "Preempt", "NotBefore": ""}]}
        )
        assert wait_until(lambda: watcher.requested)


def test_sigterm_sets_the_flag_without_raising_and_stop_restores_the_handler():
    before = signal.getsignal(signal.SIGTERM)
    watcher = PreemptionWatcher("none").start()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert wait_until(lambda: watcher.requested)
        assert watcher.reason == "received SIGTERM"
        os.kill(os.getpid(), signal.SIGTERM)  # a second one changes nothing
        assert wait_until(lambda: watcher.requested)
    finally:
        watcher.stop()
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_second_sigint_while_the_flag_is_set_interrupts_at_once():
    # Python's default handler even when the suite was started with SIGINT ignored (conftest).
    before = signal.getsignal(signal.SIGINT)
    assert before is signal.default_int_handler
    watcher = PreemptionWatcher("none").start()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert wait_until(lambda: watcher.requested)
        assert watcher.reason == "received SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs at the next bytecode
    finally:
        watcher.stop()
    assert signal.getsignal(signal.SIGINT) is before


def test_a_watcher_started_off_the_main_thread_leaves_signal_handlers_alone():
    before = signal.getsignal(signal.SIGTERM)
    watcher = PreemptionWatcher("none")
    thread = threading.Thread(target=watcher.start)
    thread.start()
    thread.join(5)
    assert signal.getsignal(signal.SIGTERM) is before
    watcher.stop()


def test_auto_recognises_each_cloud_from_dmi_files_alone(tmp_path):
    def dmi(name: str, **files: str) -> str:
        folder = tmp_path / name
        folder.mkdir()
        for key, value in files.items():
            (folder / key).write_text(value + "\n")
        return str(folder)

    assert detect_provider(dmi("aws", sys_vendor="Amazon EC2", product_name="m5.large")) == "aws"
    assert detect_provider(dmi("xen", sys_vendor="Xen", bios_version="4.11.amazon")) == "aws"
    assert detect_provider(dmi("gcp", product_name="Google Compute Engine")) == "gcp"
    azure = dmi(
        "azure",
        sys_vendor="Microsoft Corporation",
        chassis_asset_tag="7783-7084-3265-9085-8269-3286-77",
    )
    assert detect_provider(azure) == "azure"
    assert detect_provider(dmi("hyperv", sys_vendor="Microsoft Corporation")) == "none"
    assert detect_provider(str(tmp_path / "no-dmi")) == "none"


def test_auto_on_a_machine_with_no_cloud_polls_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(preemption, "DMI_DIR", str(tmp_path))
    watcher = PreemptionWatcher("auto")
    assert watcher.poller is None
    watcher.start()
    assert watcher._thread is None
    watcher.stop()


def test_an_explicit_provider_polls_the_configured_base_url():
    poller = make_poller("aws", "http://127.0.0.1:9", poll_interval=0.5)
    assert (poller.base_url, poller.interval) == ("http://127.0.0.1:9", 0.5)


def test_an_unknown_provider_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="spot.provider must be one of auto, aws, gcp, azure"):
        PreemptionWatcher("digitalocean")


def test_starting_twice_then_stopping_restores_the_original_handler():
    before = signal.getsignal(signal.SIGTERM)
    watcher = PreemptionWatcher("none")
    watcher.start()
    watcher.start()
    watcher.stop()
    assert signal.getsignal(signal.SIGTERM) is before
