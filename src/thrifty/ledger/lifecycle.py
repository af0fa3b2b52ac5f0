"""Bucket lifecycle rules that expire the checkpoints nothing needs, kept in each store's format.

What a run needs from its location: the newest checkpoints (resume takes the newest valid one,
and the one before it stands in when the newest fails verification: `checkpoint.keep_last`,
at least 2) and, for a finished run, the final checkpoint (the newest). Retention deletes
older ones while the run lives; what stays behind after it ends is those, plus anything a
run started over or a killed save left. A lifecycle rule can select objects only by key
prefix (and tags, or size), never by "all but the newest", so the rules name the superseded
step folders one by one: `PREFIX/step-00000120/` expires DAYS days after its objects were
written, and the newest `keep` published folders of each location get no rule. Write the
rules again after a run saves newer checkpoints (its newest then supersede the ones kept).

Two rules more cover each bucket prefix: multipart uploads a killed save left unfinished are
aborted after one day (they are billed and invisible to a listing), and object versions
deleted or replaced in a versioned bucket expire DAYS days after they stopped being current.

The S3 form is what `aws s3api put-bucket-lifecycle-configuration --lifecycle-configuration
file://FILE` takes; the GCS form is what `gcloud storage buckets update --lifecycle-file=FILE`
takes. Both replace the bucket's whole configuration: merge other rules in before applying.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from thrifty.errors import ThriftyError
from thrifty.ledger.locations import Location

S3_MAX_RULES = 1000  # S3 refuses a configuration of more rules
RULE_MARK = "thrifty-"  # every rule ID thrifty writes starts with it
KEEP = 2  # newest published checkpoints kept: what checkpoint.keep_last's floor keeps


@dataclass(frozen=True, slots=True)
class Plan:
    """For one bucket: the step folders that expire (by key prefix) and those kept, with
    their bytes."""

    bucket: str
    protocol: str  # s3 | gs
    days: int
    expire: tuple[str, ...]  # key prefixes "run/step-00000008/"
    keep: tuple[str, ...]
    roots: tuple[str, ...]  # each location's prefix, for the upload and version rules
    expire_bytes: int
    keep_bytes: int


def plan(
    locations: Sequence[Location], days: int, keep: Mapping[str, int] | None = None
) -> list[Plan]:
    """One plan per bucket among `locations` (local ones have no lifecycle: left out).
    `keep`: how many newest published checkpoints a location keeps, by its URL (KEEP where
    not given: the newest, which is the final one of a finished run, and the one resume
    falls back to)."""
    keep = keep or {}
    if not isinstance(days, int) or days < 1:
        raise ThriftyError(
            f"--lifecycle {days!r} is invalid: give a whole number of days, 1 or more"
        )
    buckets: dict[tuple[str, str], list[Location]] = {}
    for location in locations:
        if location.protocol in ("s3", "s3a", "gs", "gcs"):
            bucket, _ = location.bucket_and_prefix
            buckets.setdefault((location.protocol, bucket), []).append(location)
    return [
        _bucket_plan(protocol, bucket, group, days, keep)
        for (protocol, bucket), group in sorted(buckets.items())
    ]


def _bucket_plan(
    protocol: str, bucket: str, locations: list[Location], days: int, keep: Mapping[str, int]
) -> Plan:
    expire, kept, roots = [], [], []
    expire_bytes = keep_bytes = 0
    for location in locations:
        _, prefix = location.bucket_and_prefix
        roots.append(prefix)
        newest = set(location.published[-max(KEEP, keep.get(location.url, KEEP)) :])
        for step, checkpoint in sorted(location.checkpoints.items()):
            folder = f"{prefix}{checkpoint.keys[0].split('/', 1)[0]}/"
            if step in newest or step > max(newest, default=-1):
                kept.append(folder)  # the newest, and any save newer than them in flight
                keep_bytes += checkpoint.bytes
            else:
                expire.append(folder)
                expire_bytes += checkpoint.bytes
    family = "gs" if protocol in ("gs", "gcs") else "s3"
    return Plan(
        bucket, family, days, tuple(expire), tuple(kept), tuple(roots), expire_bytes, keep_bytes
    )


def _rule_id(kind: str, prefix: str) -> str:
    """A stable ID (S3 allows 255 characters): the same prefix gets the same rule again."""
    return f"{RULE_MARK}{kind}-{hashlib.sha256(prefix.encode()).hexdigest()[:12]}"


def s3_configuration(p: Plan) -> dict[str, Any]:
    """The JSON `aws s3api put-bucket-lifecycle-configuration` takes."""
    rules: list[dict[str, Any]] = [
        {
            "ID": _rule_id("expire", prefix),
            "Filter": {"Prefix": prefix},
            "Status": "Enabled",
            "Expiration": {"Days": p.days},
        }
        for prefix in p.expire
    ]
    for root in p.roots:
        rules.append(
            {
                "ID": _rule_id("uploads", root),
                "Filter": {"Prefix": root},
                "Status": "Enabled",
                "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1},
                "NoncurrentVersionExpiration": {"NoncurrentDays": p.days},
            }
        )
    if len(rules) > S3_MAX_RULES:
        raise ThriftyError(
            f"s3://{p.bucket} needs {len(rules)} lifecycle rules, more than S3's {S3_MAX_RULES}: "
            "give fewer runs at a time, or lower checkpoint.keep_last so fewer folders stay"
        )
    return {"Rules": rules}


def gcs_configuration(p: Plan) -> dict[str, Any]:
    """The JSON `gcloud storage buckets update --lifecycle-file` takes."""
    rules: list[dict[str, Any]] = []
    if p.expire:
        rules.append(
            {
                "action": {"type": "Delete"},
                "condition": {"age": p.days, "matchesPrefix": list(p.expire)},
            }
        )
    roots = list(p.roots)
    rules.append(
        {
            "action": {"type": "AbortIncompleteMultipartUpload"},
            "condition": {"age": 1, "matchesPrefix": roots},
        }
    )
    rules.append(
        {
            "action": {"type": "Delete"},
            "condition": {"daysSinceNoncurrentTime": p.days, "matchesPrefix": roots},
        }
    )
    return {"lifecycle": {"rule": rules}}


def configuration(p: Plan) -> dict[str, Any]:
    """The plan in its store's own format."""
    return gcs_configuration(p) if p.protocol == "gs" else s3_configuration(p)


def apply_command(p: Plan, file: str) -> str:
    """The command that applies `file` (the plan's configuration) to the bucket, each value
    shell-quoted: a folder named with a space or `;` stays one word and runs nothing."""
    if p.protocol == "gs":
        words = ["gcloud", "storage", "buckets", "update", f"gs://{p.bucket}"]
        words.append(f"--lifecycle-file={file}")
    else:
        words = [
            "aws", "s3api", "put-bucket-lifecycle-configuration", "--bucket", p.bucket,
            "--lifecycle-configuration", f"file://{file}",
        ]  # fmt: skip
    return shlex.join(words)


def expires(rules: Iterable[Mapping[str, Any]], key: str) -> bool:
    """Whether an S3 configuration's `rules` would expire the current object `key` (by
    prefix: the only filter thrifty's rules use)."""
    return any(
        rule.get("Status") == "Enabled"
        and "Expiration" in rule
        and key.startswith(rule.get("Filter", {}).get("Prefix", ""))
        for rule in rules
    )
