"""``sebridge fakes``: run the five fakes on loopback and print the app settings they need.

With ``--demo-world`` the fake ARM holds the golden test world: web-1 and web-2 in rg-web,
both in lb-web's pool-a. Cards and pool changes are printed as they happen. Stops on Ctrl-C or
SIGTERM, or after ``--seconds``.

With ``--port-base N`` the fakes listen on fixed ports (Teams N, ARM N+1, identity N+2, blob
N+3, the blob store with ETags for agentless ingestion's records N+4) and with
``--identity-header`` the identity endpoint takes a fixed header, so that a settings file can
name them: ``emulators/local.settings.demo.json`` does, for ``--port-base 17071
--identity-header local-demo-identity-header``.

With ``--azurite`` storage is Azurite instead (emulators/azurite: Microsoft's storage emulator,
HTTPS on ports it picks and reports): the settings printed then point the pools' state, agentless
ingestion's records and the history's table at it, turn the history on, and carry the
``REQUESTS_CA_BUNDLE`` that trusts its certificate. Its ports are not fixed, so pass those
settings to the functions host rather than the demo settings file.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading

from emulators.fakes.arm import FakeArm
from emulators.fakes.blob_etags import FakeConditionalBlobStorage
from emulators.fakes.identity import FakeIdentity
from emulators.fakes.storage import FakeBlobStorage
from emulators.fakes.teams import FakeTeams
from sebridge.signals import StopSignals

DEMO_SUBSCRIPTION = "00000000-0000-4000-8000-000000000001"
DEMO_GROUP = "rg-web"


# The golden test world's observer (tests/fixtures/golden.py): its messages pass the scope check.
DEMO_OBSERVER_VM_ID = "5c1a2c2a-79e3-4bd2-9a55-000000000001"


def seed_demo_world(arm: FakeArm) -> None:
    """web-1 (with the golden observer's vmId), web-2 and web-3 in one availability set behind
    lb-web's pool-a: web-3 keeps the pool above LB_MIN_HEALTHY while web-1 and web-2 drain."""
    lb = arm.add_load_balancer(DEMO_SUBSCRIPTION, DEMO_GROUP, "lb-web", ["pool-a"])
    aset = arm.add_availability_set(DEMO_SUBSCRIPTION, DEMO_GROUP, "as-web")
    pool = f"{lb}/backendAddressPools/pool-a"
    arm.add_vm(
        DEMO_SUBSCRIPTION,
        DEMO_GROUP,
        "web-1",
        [pool],
        availability_set=aset,
        vm_id=DEMO_OBSERVER_VM_ID,
    )
    for vm in ("web-2", "web-3"):
        arm.add_vm(DEMO_SUBSCRIPTION, DEMO_GROUP, vm, [pool], availability_set=aset)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sebridge fakes",
        description="Run the Teams, ARM, managed-identity and blob fakes (and the blob store "
        "with ETags that agentless ingestion needs) on 127.0.0.1 and print the app settings that "
        "point at them.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--demo-world", action="store_true", help="seed the fake ARM")
    parser.add_argument(
        "--port-base",
        type=int,
        default=0,
        help="Teams on this port, ARM +1, identity +2, blob +3, blob with ETags +4 (0: free ports)",
    )
    parser.add_argument(
        "--identity-header",
        default=None,
        help="the X-IDENTITY-HEADER the identity fake expects (default: a random one)",
    )
    parser.add_argument(
        "--azurite",
        action="store_true",
        help="storage on Azurite (blobs and the history's table) instead of the blob fakes",
    )
    parser.add_argument("--seconds", type=float, default=24 * 3600.0, help="stop after this long")
    args = parser.parse_args(argv)
    if not (args.port_base == 0 or 1024 <= args.port_base <= 65531):
        parser.error("--port-base must be 0 or 1024..65531")
    teams, arm = FakeTeams(print_cards=True), FakeArm(print_changes=True)
    identity, storage = FakeIdentity(header=args.identity_header), FakeBlobStorage()
    records = FakeConditionalBlobStorage()
    fakes = (teams, arm, identity, storage, records)
    ports = [args.port_base + i if args.port_base else 0 for i in range(len(fakes))]
    servers = [fake.start(port) for fake, port in zip(fakes, ports, strict=True)]
    if args.demo_world:
        seed_demo_world(arm)
    azurite = None
    settings: dict[str, str] = {
        "TEAMS_WEBHOOK_URL": teams.webhook_url,
        "ARM_ENDPOINT": arm.url,
        "HEARTBEAT_STORE_URL": storage.container_url("sebridge-heartbeats"),
        "LB_POOL_STATE_URL": storage.container_url("sebridge-pools"),
        # read only with EVENTGRID_INGEST_ENABLED=true (agentless ingestion)
        "EVENTGRID_STATE_URL": records.container_url("sebridge-eventgrid-state"),
        **identity.environ(),
    }
    if args.azurite:
        from emulators.azurite import Azurite

        try:
            azurite = Azurite().start()
        except Exception:
            for server in servers:
                server.stop()
            raise
        settings.update(
            {
                "LB_POOL_STATE_URL": azurite.container_url("sebridge-pools"),
                "HEARTBEAT_STORE_URL": azurite.container_url("sebridge-heartbeats"),
                "EVENTGRID_STATE_URL": azurite.container_url("sebridge-eventgrid-state"),
                "HistorySubscriptionName": "history",
                "HISTORY_TABLE_URL": azurite.table_url("sebridgehistory"),
                **azurite.environ(),
            }
        )
    print(json.dumps(settings, indent=2), flush=True)
    stop = threading.Event()

    # No lock taken in a signal handler; closed on return, so a caller's own handlers and
    # wakeup fd come back (tests run this main in their own process).
    try:
        with StopSignals(stop, (signal.SIGTERM,)):
            stop.wait(args.seconds)
    except KeyboardInterrupt:
        pass
    finally:
        if azurite is not None:
            azurite.stop()
        for server in servers:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
