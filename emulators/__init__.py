"""The local tools: loopback stand-ins for what a laptop cannot run (IMDS, Service Bus, the
Functions host, ARM, Teams) and the demo that runs the whole loop on them.

A distribution of its own (``emulators/pyproject.toml``), installed by the README's two
commands and never on a VM. Its subcommands join the ``sebridge`` console script through the
entry-point group ``sebridge.commands``.
"""

from sebridge.cli import Subcommand

IMDS_SIM = Subcommand("emulators.imds.server", "loopback IMDS simulator that replays scenarios")
SERVICEBUS_EMULATOR = Subcommand(
    "emulators.servicebus.server", "loopback Service Bus emulator (AMQP 1.0)"
)
FUNCTIONS_HOST = Subcommand(
    "emulators.functions_host.host", "run function_app.py locally against the emulator"
)
FAKES = Subcommand("emulators.fakes.__main__", "loopback ARM, Teams, identity and blob fakes")
DEMO = Subcommand("emulators.demo.cli", "the whole loop on 127.0.0.1, end to end")
