"""Run ``sebridge <command> ...`` trusting one more certificate authority for Service Bus.

    python benchmarks/trusting.py CA_FILE forwarder --namespace localhost ...

A VM reaches Service Bus over TLS and trusts its certificate through the CA bundle the SDK
reads (``certifi.where()``). The Service Bus emulator's TLS listener has a self-signed
certificate, and the forwarder has no setting for another bundle (nor needs one on a VM), so a
benchmark that runs the forwarder as on a VM, with a token credential over TLS, starts it
through this: the SDK's bundle becomes certifi's with CA_FILE added (a temporary file), nothing
else changes. certifi is imported a moment earlier than the SDK would import it.
"""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
from pathlib import Path

import certifi


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    # certifi's public bundle (what a VM's SDK loads) with the extra authority at its end.
    directory = Path(tempfile.mkdtemp(prefix="sebridge-ca-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    bundle = directory / "bundle.pem"
    bundle.write_text(Path(certifi.where()).read_text() + "\n" + Path(sys.argv[1]).read_text())
    certifi.where = lambda: str(bundle)  # what the SDK passes as ca_certs (its _pyamqp client)
    from sebridge.cli import main as sebridge_main

    return sebridge_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
