"""Azure names taken from messages: checked against Azure's naming rules, then quoted (pure).

Every name a message carries (observer VM, resource group, scale set, subscription, the VMs in
``Resources``) is untrusted: one VM's forwarder can send anything. Before a name reaches an ARM
URL it must be a name Azure itself would accept, and it is quoted with nothing kept safe, so that
no value can add a path segment (``/``), climb out of one (``..``), or start a query (``?``).

The rules (Azure's "Naming rules and restrictions for Azure resources", with what ARM accepts):

- subscription: a GUID;
- resource group: 1-90 characters: letters and digits (Unicode), ``_``, ``-``, ``.``, ``(``,
  ``)``; not ending in ``.``;
- virtual machine, scale set (resource names, not computer names): 1-64 characters: ASCII
  letters and digits, ``_``, ``.``, ``-``; starting with a letter or digit, ending with a letter,
  digit or ``_``. A Uniform scale-set instance is named ``<scaleSet>_<instanceId>`` by IMDS,
  which fits the same rule; its instance id is digits.

A name that breaks them raises :class:`InvalidName` saying which field and why (never echoing
more than a short, sanitised excerpt of the value into logs).
"""

from __future__ import annotations

import re
import uuid
from urllib.parse import quote

MAX_GROUP = 90
MAX_COMPUTE_NAME = 64

_GROUP = re.compile(r"[\w\-.()]*[\w\-()]", re.UNICODE)
_COMPUTE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.\-]*[A-Za-z0-9_])?", re.ASCII)
_INSTANCE_ID = re.compile(r"[0-9]{1,10}", re.ASCII)


class InvalidName(ValueError):
    """A name from a message that Azure would never have given a resource."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.reason = reason
        self.excerpt = excerpt(value)
        super().__init__(f"{field} {self.excerpt} {reason}")


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


def resource_group(value: object, field: str = "resourceGroup") -> str:
    text = _text(field, value)
    if len(text) > MAX_GROUP:
        raise InvalidName(field, value, f"is longer than {MAX_GROUP} characters")
    if not _GROUP.fullmatch(text):
        raise InvalidName(field, value, "is not a valid resource group name")
    return text


def compute_name(value: object, field: str = "vmName") -> str:
    """A VM or scale-set resource name."""
    text = _text(field, value)
    if len(text) > MAX_COMPUTE_NAME:
        raise InvalidName(field, value, f"is longer than {MAX_COMPUTE_NAME} characters")
    if not _COMPUTE.fullmatch(text):
        raise InvalidName(field, value, "is not a valid VM or scale set name")
    return text


def instance_id(value: object, field: str = "instanceId") -> str:
    text = _text(field, value)
    if not _INSTANCE_ID.fullmatch(text):
        raise InvalidName(field, value, "is not a scale-set instance id (digits)")
    return text


def segment(value: str) -> str:
    """One checked name as an ARM path segment: percent-encoded, nothing kept safe."""
    return quote(value, safe="")


def same(first: str, second: str) -> bool:
    """Azure names compare case-insensitively."""
    return first.casefold() == second.casefold()
