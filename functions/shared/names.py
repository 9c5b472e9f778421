"""Azure's naming rules, one per resource type, and the checks names from outside pass (pure).

Every name a message, an Event Grid notification or a setting carries (observer VM, resource
group, scale set, availability set, subscription, the VMs in ``Resources``) is untrusted: one
VM's forwarder can send anything. Before a name reaches an ARM URL it must be a name Azure itself
would accept for that type of resource, and it is quoted with nothing kept safe, so that no value
can add a path segment (``/``), climb out of one (``..``), or start a query (``?``).

This module is the only copy of the rules: the ingestion of Event Grid notifications, the scope
check, the settings and the ARM client all ask it (a test keeps it so). A rule stricter than
Azure's would refuse names Azure created, and every refusal is reported as a security event, so
where Microsoft's page and ARM differ the rule follows what ARM accepts.

The rules (Microsoft's "Naming rules and restrictions for Azure resources"; alphanumeric means
ASCII letters and digits):

- subscription: a GUID in its 36-character form;
- resource group: 1-90 characters: letters and digits (Unicode), ``_``, ``-``, ``.``, ``(``,
  ``)``; not ending in ``.``;
- virtual machine, virtual machine scale set (resource names, not computer names): 1-64
  characters: alphanumerics, ``_``, ``.``, ``-``; starting with an alphanumeric or ``_``, ending
  with an alphanumeric or ``_``. A Uniform scale-set instance is named ``<scaleSet>_<instanceId>``
  by IMDS, which fits the same rule; its instance id is digits;
- availability set, network interface, load balancer, backend address pool: 1-80 characters:
  alphanumerics, ``_``, ``.``, ``-``; starting with an alphanumeric, ending with an alphanumeric
  or ``_``.

A name that breaks them raises :class:`InvalidName` saying which field and why (never echoing
more than a short, sanitised excerpt of the value into logs).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from urllib.parse import quote


class InvalidName(ValueError):
    """A name from a message that Azure would never have given a resource."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.reason = reason
        self.excerpt = excerpt(value)
        super().__init__(f"{field} {self.excerpt} {reason}")


@dataclass(frozen=True)
class Rule:
    """Azure's rule for the names of one resource type."""

    kind: str  # in words, for messages: "availability set"
    max_length: int
    pattern: re.Pattern[str]  # the characters, the first and the last (any length)

    def check(self, value: object, field: str) -> str:
        text = _text(field, value)
        if len(text) > self.max_length:
            raise InvalidName(field, value, f"is longer than {self.max_length} characters")
        if not self.pattern.fullmatch(text):
            raise InvalidName(field, value, f"is not a valid {self.kind} name")
        return text

    def valid(self, value: object) -> bool:
        try:
            self.check(value, self.kind)
        except InvalidName:
            return False
        return True


_ALNUM_80 = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.\-]*[A-Za-z0-9_])?", re.ASCII)
_COMPUTE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.\-]*[A-Za-z0-9_])?", re.ASCII)

RESOURCE_GROUP = Rule("resource group", 90, re.compile(r"[\w\-.()]*[\w\-()]", re.UNICODE))
VIRTUAL_MACHINE = Rule("VM", 64, _COMPUTE)
SCALE_SET = Rule("scale set", 64, _COMPUTE)
AVAILABILITY_SET = Rule("availability set", 80, _ALNUM_80)
NETWORK_INTERFACE = Rule("network interface", 80, _ALNUM_80)
LOAD_BALANCER = Rule("load balancer", 80, _ALNUM_80)
BACKEND_POOL = Rule("backend address pool", 80, _ALNUM_80)
INSTANCE_ID = Rule("scale-set instance id", 10, re.compile(r"[0-9]+", re.ASCII))

# The rules by the resource type segment of an ARM id (lower case), for names read from ids.
BY_TYPE: dict[str, Rule] = {
    "virtualmachines": VIRTUAL_MACHINE,
    "virtualmachinescalesets": SCALE_SET,
    "availabilitysets": AVAILABILITY_SET,
    "networkinterfaces": NETWORK_INTERFACE,
    "loadbalancers": LOAD_BALANCER,
    "backendaddresspools": BACKEND_POOL,
}

MAX_GROUP = RESOURCE_GROUP.max_length
MAX_COMPUTE_NAME = VIRTUAL_MACHINE.max_length


def excerpt(value: object, limit: int = 40) -> str:
    """A short, printable rendering of an untrusted value for logs (control characters
    escaped, long values cut)."""
    text = value if isinstance(value, str) else repr(value)
    shown = text[:limit].encode("unicode_escape").decode("ascii")
    return repr(shown + ("..." if len(text) > limit else ""))


def _text(field: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidName(field, value, "is empty or not a string")
    return value


def subscription_id(value: object, field: str = "subscriptionId") -> str:
    text = _text(field, value)
    try:
        parsed = uuid.UUID(text)
    except ValueError:
        raise InvalidName(field, value, "is not a GUID") from None
    if len(text) != 36 or str(parsed) != text.lower():
        raise InvalidName(field, value, "is not a GUID in its 36-character form")
    return text


def is_subscription_id(value: object) -> bool:
    try:
        subscription_id(value)
    except InvalidName:
        return False
    return True


def resource_group(value: object, field: str = "resourceGroup") -> str:
    return RESOURCE_GROUP.check(value, field)


def compute_name(value: object, field: str = "vmName") -> str:
    """A VM or scale-set resource name."""
    return VIRTUAL_MACHINE.check(value, field)


def availability_set(value: object, field: str = "availabilitySet") -> str:
    return AVAILABILITY_SET.check(value, field)


def instance_id(value: object, field: str = "instanceId") -> str:
    return INSTANCE_ID.check(value, field)


def segment(value: str) -> str:
    """One checked name as an ARM path segment: percent-encoded, nothing kept safe."""
    return quote(value, safe="")


def same(first: str, second: str) -> bool:
    """Azure names compare case-insensitively."""
    return first.casefold() == second.casefold()
