"""Fault injection rules for the IMDS simulator: which request gets which failure.

Pure apart from a seeded ``random.Random`` per probabilistic rule. A rule is JSON (from
``POST /_sim/faults``) or a compact ``--fault`` string::

    {"kind": "429", "count": 3, "retryAfter": 1}          --fault 429:count=3,retryAfter=1
    {"kind": "5xx", "probability": 0.3, "seed": 7, "status": 503}
    {"kind": "4xx", "target": "post", "status": 400}      --fault 4xx:target=post
    {"kind": "hang", "count": 1, "seconds": 3}            (held, then answered normally)
    {"kind": "malformed", "count": 2, "body": "not-json"}  (or "not-document")
    {"kind": "reset", "count": 1, "target": "post"}       (TCP RST, no response)

``target`` is ``get`` (scheduledevents GET, the default), ``post`` (scheduledevents POST),
``instance`` (instance metadata GET) or ``any``. A rule fires ``count`` times (default 1), or
with ``probability`` on every matching request (for at most ``count`` times if both are
given). Rules are checked in order; the first that fires decides. A hang delays the request
and then lets the next rules (and the normal answer) proceed. A ``4xx`` (``status`` 400..499,
default 400) answers as IMDS does a request it refuses, even a well-formed one: the forwarder's
handling of a refused approval can be tested with a valid StartRequests body.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

KINDS = ("429", "5xx", "4xx", "hang", "malformed", "reset")
TARGETS = ("get", "post", "instance", "any")
MALFORMED_BODIES = ("not-json", "not-document")
MAX_HANG_SECONDS = 30.0  # a hang must never outlive a test's timeout by much

_KEYS = {
    "kind",
    "count",
    "probability",
    "seed",
    "target",
    "retryAfter",
    "status",
    "seconds",
    "body",
}


class FaultError(ValueError):
    """A fault rule that makes no sense (the message says which part)."""


@dataclass
class FaultRule:
    kind: str
    target: str = "get"
    count: int | None = 1  # None: unlimited (probability rules)
    probability: float | None = None
    seed: int | None = None
    retry_after: int = 1
    status: int = 500  # 5xx; a 4xx rule defaults to 400 (see parse_rule)
    seconds: float = 5.0
    body: str = "not-json"
    fired: int = 0
    _rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def matches(self, target: str) -> bool:
        return self.target in (target, "any")

    def exhausted(self) -> bool:
        return self.count is not None and self.fired >= self.count

    def roll(self) -> bool:
        """Whether the rule fires for this request (counts it if so)."""
        if self.exhausted():
            return False
        if self.probability is not None and self._rng.random() >= self.probability:
            return False
        self.fired += 1
        return True

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "target": self.target, "fired": self.fired}
        if self.count is not None:
            out["count"] = self.count
        if self.probability is not None:
            out["probability"] = self.probability
            out["seed"] = self.seed
        extra: dict[str, tuple[str, object]] = {
            "429": ("retryAfter", self.retry_after),
            "5xx": ("status", self.status),
            "4xx": ("status", self.status),
            "hang": ("seconds", self.seconds),
            "malformed": ("body", self.body),
        }
        if self.kind in extra:
            key, value = extra[self.kind]
            out[key] = value
        return out


def _int(value: object, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise FaultError(f"{where} must be an integer from {low} to {high}, got {value!r}")
    return value


def _float(value: object, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise FaultError(f"{where} must be a number from {low:g} to {high:g}, got {value!r}")
    return float(value)


def parse_rule(obj: object) -> FaultRule:
    if not isinstance(obj, Mapping):
        raise FaultError(f"a fault rule must be an object, got {obj!r}")
    unknown = sorted(set(obj) - _KEYS)
    if unknown:
        raise FaultError(f"unknown fault key(s) {unknown} (allowed: {sorted(_KEYS)})")
    kind = obj.get("kind")
    if kind not in KINDS:
        raise FaultError(f"kind must be one of {list(KINDS)}, got {kind!r}")
    target = obj.get("target", "get")
    if target not in TARGETS:
        raise FaultError(f"target must be one of {list(TARGETS)}, got {target!r}")
    probability = None
    if "probability" in obj:
        probability = _float(obj["probability"], "probability", 0.0, 1.0)
    count: int | None = 1 if probability is None else None
    if "count" in obj:
        count = _int(obj["count"], "count", 1, 1_000_000)
    seed = None
    if "seed" in obj:
        seed = _int(obj["seed"], "seed", 0, 2**31)
    rule = FaultRule(
        kind=str(kind), target=str(target), count=count, probability=probability, seed=seed
    )
    if "retryAfter" in obj:
        rule.retry_after = _int(obj["retryAfter"], "retryAfter", 0, 3600)
    low, high = (400, 499) if kind == "4xx" else (500, 599)
    if kind == "4xx":
        rule.status = 400
    if "status" in obj:
        rule.status = _int(obj["status"], "status", low, high)
    if "seconds" in obj:
        rule.seconds = _float(obj["seconds"], "seconds", 0.0, MAX_HANG_SECONDS)
    if "body" in obj:
        if obj["body"] not in MALFORMED_BODIES:
            raise FaultError(f"body must be one of {list(MALFORMED_BODIES)}, got {obj['body']!r}")
        rule.body = str(obj["body"])
    return rule


def parse_rules(obj: object) -> list[FaultRule]:
    """``[rule, ...]`` or ``{"rules": [rule, ...]}``."""
    if isinstance(obj, Mapping) and set(obj) <= {"rules"}:
        obj = obj.get("rules", [])
    if not isinstance(obj, list):
        raise FaultError('expected a list of fault rules or {"rules": [...]}')
    return [parse_rule(item) for item in obj]


def _scalar(text: str) -> object:
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def parse_cli_rule(text: str) -> FaultRule:
    """``kind:key=value,key=value`` (``--fault 429:count=3,retryAfter=2``)."""
    kind, _, rest = text.partition(":")
    obj: dict[str, object] = {"kind": kind.strip()}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise FaultError(f"--fault {text!r}: expected key=value, got {part!r}")
        obj[key.strip()] = _scalar(value.strip())
    return parse_rule(obj)


@dataclass(frozen=True)
class Decision:
    """What to do with one request: wait ``hang`` seconds, then ``rule`` (None = answer)."""

    hang: float = 0.0
    rule: FaultRule | None = None


def decide(rules: Sequence[FaultRule], target: str) -> Decision:
    hang = 0.0
    for rule in rules:
        if not rule.matches(target) or not rule.roll():
            continue
        if rule.kind == "hang":
            hang = min(MAX_HANG_SECONDS, hang + rule.seconds)
            continue
        return Decision(hang=hang, rule=rule)
    return Decision(hang=hang)
