"""The Grafana dashboard (infra/grafana/forwarder-dashboard.json) against a real forwarder.

A real `sebridge forwarder` process (dry run, every optional metric on: ``--hooks-file``,
``--drain-probe-port``) watches the loopback IMDS stub through one event of its own VM, Started
then gone, so that each metric has something to say. Then:

- every metric sample a panel queries is in the forwarder's ``/metrics``, and every metric the
  forwarder exports is on the dashboard or in :data:`LEFT_OUT` with the reason;
- a real Prometheus (Debian's ``prometheus``, scripts/ensure-system-tools) scrapes the
  forwarder on loopback and evaluates every panel query, with Grafana's variables filled in:
  each one parses and returns series, and every label a panel groups by is on them.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from emulators.ports import reserve_port
from emulators.processes import ChildProcess, forwarder
from tests.forwarder.local_support import root_dir, script, write_hooks
from tests.support.imds_stub import ImdsStub
from tests.support.root import skip_unless_root
from tests.support.waiting import wait_until

DASHBOARD = Path(__file__).resolve().parents[2] / "infra" / "grafana" / "forwarder-dashboard.json"
VM = "stub-vm"
# Metrics the forwarder exports that the dashboard deliberately does not show, with the reason.
LEFT_OUT: dict[str, str] = {}
# What Grafana puts in for its variables when it runs a query.
VARIABLES = {"$instance": ".+", "$__rate_interval": "1m", "$__range": "5m", "$__interval": "15s"}
METRIC = re.compile(r"\bsebridge_forwarder_[a-z_]+\b")
SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_info")
pytestmark = pytest.mark.timeout(240)


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text("utf-8"))
    return loaded


def queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target."""
    return [
        (panel["title"], target["expr"])
        for panel in dashboard()["panels"]
        for target in panel.get("targets", [])
    ]


def variable_queries() -> list[tuple[str, str]]:
    """(metric, label) of every ``label_values(metric, label)`` variable (Grafana's, not
    PromQL: Prometheus answers it as the metric's series, and they must carry the label)."""
    out = []
    for variable in dashboard()["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            found = re.fullmatch(r"label_values\((\w+), *(\w+)\)", query["query"])
            assert found, query
            out.append((found[1], found[2]))
    return out


def family(sample: str) -> str:
    for suffix in SUFFIXES:
        if sample.endswith(suffix):
            return sample.removesuffix(suffix)
    return sample


def fill(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


@dataclass
class Fleet:
    fw: ChildProcess
    metrics_port: int
    prometheus: ChildProcess | None = None
    prometheus_port: int = 0

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text: str = answer.read().decode("utf-8")
        return text

    def query(self, expr: str) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.prometheus_port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                body: dict[str, Any] = json.loads(answer.read())
        except urllib.error.HTTPError as exc:  # 400: the query does not parse; 503: starting
            text = exc.read().decode("utf-8", "replace")
            try:
                body = json.loads(text)
            except ValueError:
                body = {"status": "error", "error": f"{exc.code}: {text[:200]}"}
        return body


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    skip_unless_root("a hooks file must be root-owned")
    base = tmp_path_factory.mktemp("dashboard")
    etc = root_dir(base)
    hooks = write_hooks(
        etc, [{"name": "drain", "on": ["Started"], "command": [script(etc, "ok.sh", "exit 0")]}]
    )
    event_id = str(uuid.uuid4())
    with ImdsStub() as imds:
        imds.set_events(
            [
                {
                    "EventId": event_id,
                    "EventType": "Reboot",
                    "ResourceType": "VirtualMachine",
                    "Resources": [VM],
                    "EventStatus": "Started",
                    "NotBefore": "",
                    "EventSource": "Platform",
                    "DurationInSeconds": -1,
                }
            ]
        )
        metrics_port, probe_port = reserve_port(), reserve_port()
        fw = forwarder(
            imds.url,
            base / "state",
            "--vm-name",
            VM,
            "--metrics-port",
            str(metrics_port),
            "--hooks-file",
            str(hooks),
            "--drain-probe-port",
            str(probe_port),
        ).start()
        try:
            fleet = Fleet(fw, metrics_port)
            assert fw.wait_for(
                lambda _: any(m.get("subject") == "Started" for m in fw.json_lines()), 60
            ), fw.stderr_text()[-3000:]
            imds.set_events([])
            assert fw.wait_for(
                lambda _: any(m.get("subject") == "Completed" for m in fw.json_lines()), 60
            ), fw.stderr_text()[-3000:]
            # One answer of the drain probe (503 is one too), so that its counter has a series.
            with contextlib.suppress(urllib.error.HTTPError):
                urllib.request.urlopen(f"http://127.0.0.1:{probe_port}/", timeout=10).close()
            wait_until(lambda: "hook_runs_total{" in fleet.metrics(), 30, "the metrics endpoint")
            yield fleet
        finally:
            if fleet.prometheus is not None:
                fleet.prometheus.close()
            fw.close()


def start_prometheus(fleet: Fleet, directory: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed: run scripts/ensure-system-tools (Debian's)")
    config = directory / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: sebridge-forwarder\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{fleet.metrics_port}']\n"
    )
    port = reserve_port()
    process = ChildProcess("prometheus", [], name="prometheus")
    process.argv = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    fleet.prometheus, fleet.prometheus_port = process.start(), port

    def scraped_enough() -> bool:
        try:
            result = fleet.query("count_over_time(up{job='sebridge-forwarder'}[1m])")
        except OSError:
            return False
        values = result.get("data", {}).get("result", [])
        return bool(values) and float(values[0]["value"][1]) >= 5

    wait_until(scraped_enough, 60, "five scrapes of the forwarder by Prometheus")


def test_the_dashboard_queries_only_what_the_forwarder_exports_and_shows_all_of_it(
    fleet: Fleet,
) -> None:
    exported_samples = set()
    exported_families = set()
    for metric in text_string_to_metric_families(fleet.metrics()):
        exported_families.add(family(metric.name))
        exported_samples.update(sample.name for sample in metric.samples)
    queried = {name for _, expr in queries() for name in METRIC.findall(expr)}
    queried |= {metric for metric, _ in variable_queries()}
    assert queried - exported_samples == set(), "the dashboard queries what is not exported"
    shown = {family(name) for name in queried}
    assert exported_families - shown - set(LEFT_OUT) == set(), (
        "exported but neither on the dashboard nor in LEFT_OUT"
    )
    assert set(LEFT_OUT) <= exported_families, "LEFT_OUT names what is not exported"


def test_the_dashboard_is_importable_as_grafana_exports_it() -> None:
    board = dashboard()
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    names = {variable["name"] for variable in board["templating"]["list"]}
    assert {"datasource", "instance"} <= names
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            assert 'instance=~"$instance"' in target["expr"], (panel["title"], target["expr"])


def test_prometheus_evaluates_every_panel_query_to_series(
    fleet: Fleet, tmp_path_factory: pytest.TempPathFactory
) -> None:
    start_prometheus(fleet, tmp_path_factory.mktemp("prometheus"))
    for title, expr in queries():
        answer = fleet.query(fill(expr))
        assert answer.get("status") == "success", (title, expr, answer.get("error"))
        series = answer["data"]["result"]
        assert series, f"{title}: no series for {fill(expr)}"
        for grouping in re.findall(r"\bby \(([^)]*)\)", expr):
            for label in (part.strip() for part in grouping.split(",")):
                if label == "le":
                    continue
                assert all(label in s["metric"] for s in series), (title, label, series[:2])
    # The measured impact of the event the forwarder watched reached Prometheus.
    count = fleet.query(
        "sum(sebridge_forwarder_measured_impact_seconds_count{method='freeze-pause'})"
    )
    assert float(count["data"]["result"][0]["value"][1]) == 1
    for metric, label in variable_queries():
        answer = fleet.query(metric)
        assert answer["data"]["result"], metric
        assert all(label in s["metric"] for s in answer["data"]["result"])
