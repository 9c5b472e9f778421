"""A scheduled-events listener written the way Microsoft's documentation shows it.

This is the baseline the forwarder is measured against (benchmarks/forwarder_poll.py): the
Python sample from "Azure Metadata Service: Scheduled Events for Linux VMs", a `requests.get`
per poll without a session, `time.sleep(1)` between polls, and a print of each event. The
only change: the endpoint comes from argv (never 169.254.169.254 here) and the loop is bounded.
"""

from __future__ import annotations

import json
import sys
import time

import requests

metadata_url = sys.argv[1].rstrip("/") + "/metadata/scheduledevents"
header = {"Metadata": "true"}
query_params = {"api-version": "2020-07-01"}
interval = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
max_polls = int(sys.argv[3]) if len(sys.argv) > 3 else 3600


def get_scheduled_events():  # type: ignore[no-untyped-def]
    resp = requests.get(metadata_url, headers=header, params=query_params, timeout=10)
    data = resp.json()
    return data


def handle_scheduled_events(data):  # type: ignore[no-untyped-def]
    for evt in data["Events"]:
        eventid = evt["EventId"]
        status = evt["EventStatus"]
        resources = evt["Resources"]
        eventtype = evt["EventType"]
        resourcetype = evt["ResourceType"]
        notbefore = evt["NotBefore"].replace(" ", "_")
        description = evt.get("Description", "")
        eventSource = evt.get("EventSource", "")
        print(
            "+ Scheduled Event. This script is running on " + str(resources),
            json.dumps(
                [eventid, status, eventtype, resourcetype, notbefore, description, eventSource]
            ),
            flush=True,
        )


def main() -> None:
    for _ in range(max_polls):
        data = get_scheduled_events()
        handle_scheduled_events(data)
        time.sleep(interval)


if __name__ == "__main__":
    main()
