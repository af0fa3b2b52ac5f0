"""Preemption: SIGTERM, SIGINT, SIGUSR1 and cloud spot-interruption notices all raise one flag.

The signals watched are configurable (`spot.signals`): SIGUSR1 is what Slurm sends ahead of a
job's time limit with `--signal=USR1@120`.

The training loop reads `watcher.requested` once per step (a plain attribute read). When it is
set, the loop saves an emergency checkpoint at the step boundary, waits for the upload up to a
deadline and exits with `EXIT_PREEMPTED`. Nothing is saved inside a signal handler: the handler
only sets the flag.

Notice pollers (one daemon thread, stdlib HTTP, proxies bypassed):
  aws    IMDSv2 token (PUT /latest/api/token), then /latest/meta-data/spot/instance-action
         (404: nothing pending) and /latest/meta-data/events/recommendations/rebalance
  gcp    /computeMetadata/v1/instance/preempted with `Metadata-Flavor: Google` (TRUE/FALSE)
  azure  /metadata/scheduledevents with `Metadata: true`: a Preempt or Terminate event
`auto` picks the cloud from DMI files under /sys, without any network traffic, and polls
nothing when no cloud is recognised.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, Protocol

from thrifty.errors import ConfigError

# The exit code and the signals are the stop signals' own (imported here by their older name).
from thrifty.records.stop_signals import DEFAULT_SIGNALS, EXIT_PREEMPTED, parse_signals

__all__ = [
    "DEFAULT_SIGNALS",
    "EXIT_PREEMPTED",
    "PreemptionWatcher",
    "detect_provider",
    "make_poller",
    "parse_signals",
]

log = logging.getLogger("thrifty.checkpointing.saving.preemption")

PROVIDERS = ("auto", "aws", "gcp", "azure", "none")
DMI_DIR = "/sys/class/dmi/id"
# The asset tag every Azure VM reports in its DMI chassis information.
_AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"
# After this many failed polls in a row the watcher says once that notices are not seen.
_FAILURES_BEFORE_WARNING = 3


def detect_provider(dmi_dir: str | None = None) -> str:
    """The cloud this machine runs on, from DMI files only: "aws", "gcp", "azure" or "none"."""
    root = dmi_dir or DMI_DIR

    def read(name: str) -> str:
        try:
            with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
                return f.read().strip()
        except OSError:
            return ""

    vendor = f"{read('sys_vendor')} {read('board_vendor')}".lower()
    product, bios = read("product_name").lower(), read("bios_version").lower()
    if "amazon" in vendor or "amazon" in bios:
        return "aws"
    if "google" in vendor or "google compute engine" in product:
        return "gcp"
    if read("chassis_asset_tag") == _AZURE_ASSET_TAG:
        return "azure"
    return "none"


# --- notice pollers ------------------------------------------------------------------------------


class NoticePoller(Protocol):
    """One cloud's metadata endpoint. `poll()` returns a reason when a notice is pending."""

    name: str
    base_url: str
    interval: float

    def poll(self) -> str | None: ...


class _Http:
    """GET/PUT against a metadata service: no proxies (they cannot reach link-local addresses)."""

    def __init__(self, base_url: str, timeout: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def request(
        self, path: str, headers: dict[str, str], method: str = "GET"
    ) -> tuple[int, str, Any]:
        """(status, body, response headers); 4xx/5xx come back as a status, not an exception."""
        req = urllib.request.Request(self.base_url + path, headers=headers, method=method)
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                return resp.status, resp.read().decode("utf-8", "replace"), resp.headers
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.read().decode("utf-8", "replace"), exc.headers


class _MetadataPoller:
    """A cloud's metadata service (`DEFAULT_URL` unless given), asked every `interval` seconds,
    each request given up after `timeout` seconds."""

    DEFAULT_URL = "http://169.254.169.254"  # the link-local address AWS and Azure answer on

    def __init__(self, base_url: str | None = None, interval: float = 1.0, timeout: float = 2.0):
        self.base_url = base_url or self.DEFAULT_URL
        self.interval = interval
        self._http = _Http(self.base_url, timeout)


class AwsPoller(_MetadataPoller):
    """EC2 spot instance-action and rebalance recommendation, through the IMDSv2 token flow."""

    name = "aws"
    TOKEN_TTL = 21600  # seconds

    def __init__(self, base_url: str | None = None, interval: float = 5.0, timeout: float = 2.0):
        super().__init__(base_url, interval, timeout)
        self._token: str | None = None
        self._token_expires = 0.0

    def _headers(self) -> dict[str, str]:
        if self._token is None or time.monotonic() > self._token_expires:
            status, body, _ = self._http.request(
                "/latest/api/token",
                {"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL)},
                method="PUT",
            )
            if status != 200:
                raise OSError(f"IMDSv2 token request answered HTTP {status}")
            self._token = body.strip()
            self._token_expires = time.monotonic() + self.TOKEN_TTL - 60
        return {"X-aws-ec2-metadata-token": self._token}

    def _get(self, path: str) -> tuple[int, str]:
        status, body, _ = self._http.request(path, self._headers())
        if status == 401:  # token expired early (instance stopped and started): get a new one
            self._token = None
            status, body, _ = self._http.request(path, self._headers())
        return status, body

    def poll(self) -> str | None:
        status, body = self._get("/latest/meta-data/spot/instance-action")
        if status == 200:
            notice = _json_or_empty(body)
            action, when = notice.get("action", "interruption"), notice.get("time", "soon")
            return f"AWS spot instance-action notice: {action} at {when}"
        if status != 404:
            raise OSError(f"spot/instance-action answered HTTP {status}")
        status, body = self._get("/latest/meta-data/events/recommendations/rebalance")
        if status == 200:
            notice_time = _json_or_empty(body).get("noticeTime", "now")
            return f"AWS rebalance recommendation at {notice_time}"
        if status != 404:
            raise OSError(f"rebalance recommendation answered HTTP {status}")
        return None


class GcpPoller(_MetadataPoller):
    """GCE `instance/preempted`: TRUE once the VM is being preempted (about 30 s of notice)."""

    name = "gcp"
    DEFAULT_URL = "http://metadata.google.internal"

    def poll(self) -> str | None:
        status, body, headers = self._http.request(
            "/computeMetadata/v1/instance/preempted", {"Metadata-Flavor": "Google"}
        )
        if status != 200 or headers.get("Metadata-Flavor") != "Google":
            raise OSError(
                f"instance/preempted answered HTTP {status} (not the GCE metadata server?)"
            )
        return (
            "GCP preemption notice (instance/preempted is TRUE)" if body.strip() == "TRUE" else None
        )


class AzurePoller(_MetadataPoller):
    """Azure Scheduled Events: a `Preempt` (spot eviction) or `Terminate` event is a notice."""

    name = "azure"
    EVENT_TYPES = ("Preempt", "Terminate")

    def poll(self) -> str | None:
        status, body, _ = self._http.request(
            "/metadata/scheduledevents?api-version=2020-07-01", {"Metadata": "true"}
        )
        if status != 200:
            raise OSError(f"scheduledevents answered HTTP {status}")
        for event in _json_or_empty(body).get("Events", []):
            if isinstance(event, dict) and event.get("EventType") in self.EVENT_TYPES:
                not_before = event.get("NotBefore") or "soon"
                return f"Azure scheduled event {event['EventType']} not before {not_before}"
        return None


def _json_or_empty(body: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


_POLLERS: dict[str, Callable[[str | None], NoticePoller]] = {
    "aws": AwsPoller,
    "gcp": GcpPoller,
    "azure": AzurePoller,
}


def make_poller(
    provider: str, base_url: str | None = None, poll_interval: float | None = None
) -> NoticePoller | None:
    """The poller for `provider` (auto-detected from DMI for "auto"), or None for no cloud."""
    if provider not in PROVIDERS:
        raise ConfigError(f"spot.provider must be one of {', '.join(PROVIDERS)}, got {provider!r}")
    if poll_interval is not None and not poll_interval > 0:
        # The same words as the config's own check: the key the user sets is spot.poll_seconds.
        raise ConfigError(
            f"spot.poll_seconds = {poll_interval!r} is invalid: must be greater than 0"
        )
    if provider == "auto":
        # THRIFTY_SPOT_PROVIDER pins what `auto` means on a machine (test suites set "none").
        provider = os.environ.get("THRIFTY_SPOT_PROVIDER") or detect_provider()
        if provider not in PROVIDERS or provider == "auto":
            raise ConfigError(
                f"THRIFTY_SPOT_PROVIDER must be one of aws, gcp, azure, none, got {provider!r}"
            )
    if provider == "none":
        return None
    poller = _POLLERS[provider](base_url)
    if poll_interval is not None:
        poller.interval = poll_interval
    return poller


def _restorable(handler: Any) -> Any:
    # getsignal() gives None for a handler installed outside Python; the default is closest.
    return signal.SIG_DFL if handler is None else handler


# --- the watcher ---------------------------------------------------------------------------------


class PreemptionWatcher:
    """Raises `requested` on one of `signals` (default SIGTERM, SIGINT, SIGUSR1) or a cloud
    interruption notice; `reason` says which.

    Signal handlers are installed by `start()` only when called from the main thread (Python
    allows no other) and restored by `stop()`. A Ctrl-C while a request is pending (during the
    emergency save) says how many steps stopping at once would lose, and asks for one more:
    that one restores the previous handler and raises KeyboardInterrupt (`forced`), so a run
    that is stuck still stops. A second SIGTERM changes nothing. Signals that were ignored
    (SIG_IGN) stay ignored.

    `step`, `saved_step` and `saving` (the step trained last, the newest checkpoint's, the
    step of the emergency checkpoint being written) are kept by whoever saves (the run checkpointer),
    for that count.
    """

    def __init__(
        self,
        provider: str = "auto",
        *,
        base_url: str | None = None,
        poll_interval: float | None = None,
        signals: Sequence[str] = DEFAULT_SIGNALS,
    ) -> None:
        self.signals = parse_signals(signals)
        self.poller = make_poller(provider, base_url, poll_interval)
        self.requested = False
        self.reason = ""
        self._previous: dict[int, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self.step = 0
        self.saved_step = 0
        self.saving: int | None = None
        # The newest checkpoint on disk, where a background writer knows it better than
        # saved_step (a save handed over is not yet written): None, or a call that asks it.
        self.written: Callable[[], int | None] | None = None
        self.forced = False  # stopped by Ctrl-C before the emergency checkpoint was written
        self._presses = 0  # Ctrl-C pressed while a request was pending

    def __enter__(self) -> PreemptionWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def request(self, reason: str) -> None:
        """Ask the training loop to checkpoint and exit at the next step boundary."""
        if not self.requested:
            self.reason = reason  # set before the flag: whoever sees the flag sees the reason
            self.requested = True

    def start(self) -> PreemptionWatcher:
        """Install the signal handlers (main thread only) and start polling for notices."""
        if self._started:
            return self
        self._started = True
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                previous = signal.getsignal(signum)
                if previous is signal.SIG_IGN:
                    continue
                self._previous[signum] = previous
                signal.signal(signum, self._on_signal)
        else:
            names = "/".join(s.name for s in self.signals)
            log.info("not in the main thread: %s are left to their current handlers", names)
        if self.poller is not None and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._poll_loop, name="thrifty-preemption", daemon=True
            )
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop polling (waiting up to `timeout` seconds) and restore the previous handlers."""
        self._started = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if threading.current_thread() is threading.main_thread():
            for signum, previous in self._previous.items():
                if signal.getsignal(signum) == self._on_signal:
                    signal.signal(signum, _restorable(previous))
            self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Runs between two bytecodes of the main thread: set the flag, or say what a forced
        # stop would lose (one unbuffered write: no lock, no stream another write is in).
        if self.requested and signum == signal.SIGINT:
            self._presses += 1
            risk = self.at_risk()
            if self._presses == 1 and risk is not None:
                if os.environ.get("RANK", "0") == "0":  # every rank hears a terminal's Ctrl-C
                    os.write(2, f"thrifty: {risk}: press Ctrl-C again to stop at once\n".encode())
                return
            self.forced = True
            signal.signal(signum, _restorable(self._previous.pop(signum, None)))
            lost = self._lost()
            raise KeyboardInterrupt(f"stopped at once: {lost} are lost" if lost else "")
        self.request(f"received {signal.Signals(signum).name}")

    def at_risk(self) -> str | None:
        """What stopping at once would lose, in words; None when nothing would be."""
        lost = self._lost()
        if lost is None:
            return None
        if self.saving is None:
            return (
                "an emergency checkpoint follows the step in progress; stopping now loses "
                f"{lost} and the one in progress"
            )
        return (
            f"the emergency checkpoint of step {self.saving} is being written; stopping now "
            f"loses {lost}"
        )

    def _lost(self) -> str | None:
        """The steps a stop at once loses, in words ("the 7 steps since the last checkpoint
        (step 5)"); None when every step is saved."""
        saved = max(self.saved_step, (self.written() or 0) if self.written else 0)
        n = self.step - saved
        if n <= 0 and self.saving is None:
            return None
        since = (
            f"since the last checkpoint (step {saved})"
            if saved
            else "since the start (there is no checkpoint yet)"
        )
        return f"the {n} step{'' if n == 1 else 's'} {since}"

    def _poll_loop(self) -> None:
        poller = self.poller
        assert poller is not None
        failures = 0
        while not self._stop.is_set():
            try:
                reason = poller.poll()
            except (OSError, ValueError, http.client.HTTPException) as exc:
                failures += 1
                if failures == _FAILURES_BEFORE_WARNING:
                    log.warning(
                        "cannot read %s spot notices from %s (%s): relying on SIGTERM only",
                        poller.name,
                        poller.base_url,
                        exc,
                    )
            else:
                failures = 0
                if reason is not None:
                    log.warning("preemption notice: %s", reason)
                    self.request(reason)
                    return
            self._stop.wait(poller.interval)
