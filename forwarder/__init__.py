"""The forwarder that runs on every VM: poll IMDS, diff, persist, publish, apply approvals.

Installed as ``sebridge.forwarder`` (the VM package maps this folder there). Its subcommands
are registered with the ``sebridge`` console script through the entry-point group
``sebridge.commands`` (see pyproject.toml).
"""

from sebridge.cli import Subcommand

FORWARDER = Subcommand(
    "sebridge.forwarder.main", "poll IMDS, publish lifecycle transitions, apply approvals"
)
APPROVE = Subcommand(
    "sebridge.forwarder.approvals.cli", "send an approval command to a VM's forwarder"
)
STATUS = Subcommand(
    "sebridge.forwarder.observability.status_cli",
    "show this VM's forwarder state: events, outbox, set-aside messages, last poll and send",
)
DOCTOR = Subcommand(
    "sebridge.forwarder.observability.doctor",
    "check that this VM's forwarder can work: IMDS, token, send, receive, unit, hooks, probe",
)
