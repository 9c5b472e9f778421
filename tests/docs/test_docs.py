"""Docs that cannot drift (issue 25).

- Every command block marked runnable (an HTML comment ``<!-- runnable -->`` on the line before
  its fence, optionally ``expect="text"``) in README.md and docs/ runs here against the local
  stand-ins, as a user would paste it: bash, ``set -euo pipefail``, the project's ``.venv/bin``
  first on PATH, a scratch directory, the well-known ports the docs use replaced by free ones.
  It must exit 0 (and print the expected text); whatever it started in the background is
  stopped when it ends.
- Every flag of every ``sebridge`` command, every app setting the Function App reads, every
  parameter of the two Bicep templates and every metric the forwarder exports is documented;
  and every one the docs name in their reference tables exists.
- Every relative link in README.md and docs/ points at a file that exists (and a heading anchor
  that exists, for links into docs/).
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from emulators.ports import reserve_port

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
BIN = Path(sys.executable).parent

# The ports the docs' examples name (README and docs/local-development.md): replaced by free
# ones when a block runs, so that blocks run side by side and next to other tests.
WELL_KNOWN_PORTS = (8080, 5672, 7071, 17071, 17072, 17073, 17074, 17075, 9464, 8081)

RUNNABLE = re.compile(
    r"^<!-- runnable(?: expect=\"(?P<expect>[^\"]*)\")? -->\n```(?:sh|bash)\n(?P<body>.*?)^```$",
    re.M | re.S,
)


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def all_docs() -> str:
    return "\n".join(text(p) for p in PAGES)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    body: str
    expect: str | None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def runnable_blocks() -> list[Block]:
    blocks = []
    for path in PAGES:
        content = text(path)
        for m in RUNNABLE.finditer(content):
            line = content.count("\n", 0, m.start()) + 1
            blocks.append(Block(path.name, line, m.group("body"), m.group("expect")))
    return blocks


def test_some_blocks_are_runnable() -> None:
    """The check below must check something: the forwarder's laptop example at least."""
    assert len(runnable_blocks()) >= 3


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("block", runnable_blocks(), ids=str)
def test_a_runnable_block_runs(block: Block, tmp_path: Path) -> None:
    body = block.body
    for port in WELL_KNOWN_PORTS:
        if re.search(rf"\b{port}\b", body):
            body = re.sub(rf"\b{port}\b", str(reserve_port()), body)
    body = body.replace("/tmp/", f"{tmp_path}/")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = tmp_path / "output.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            ["bash", "-c", "set -euo pipefail\n" + body],
            cwd=tmp_path,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            process.wait(timeout=150)
        finally:
            with contextlib.suppress(ProcessLookupError):  # what it left in the background
                os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
    output = log.read_text(errors="replace")
    assert process.returncode == 0, f"{block} exited {process.returncode}:\n{output[-3000:]}"
    if block.expect is not None:
        assert block.expect in output, f"{block} did not print {block.expect!r}:\n{output[-3000:]}"


# --- flags -----------------------------------------------------------------------------------

VM_COMMANDS = ("forwarder", "approve", "status", "doctor")
LOCAL_COMMANDS = ("imds-sim", "servicebus-emulator", "functions-host", "fakes", "demo")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]")


def help_flags(command: str) -> set[str]:
    result = subprocess.run(
        [str(BIN / "sebridge"), command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
        check=True,
    )
    return set(FLAG.findall(result.stdout)) - {"--help"}


@pytest.fixture(scope="module")
def flags() -> dict[str, set[str]]:
    return {command: help_flags(command) for command in (*VM_COMMANDS, *LOCAL_COMMANDS)}


@pytest.mark.parametrize("command", [*VM_COMMANDS, *LOCAL_COMMANDS])
def test_every_flag_is_documented(command: str, flags: dict[str, set[str]]) -> None:
    documented = set(FLAG.findall(all_docs()))
    missing = sorted(flags[command] - documented)
    assert not missing, f"sebridge {command}: flags no page documents: {missing}"


def invocations(content: str) -> Iterator[tuple[str, str]]:
    """(command, the rest of the line) of each ``sebridge <command> ...`` the docs show."""
    commands = "|".join(re.escape(c) for c in (*VM_COMMANDS, *LOCAL_COMMANDS))
    for m in re.finditer(rf"\bsebridge ({commands})\b([^\n`|]*)", content):
        yield m.group(1), m.group(2)


def test_every_flag_the_docs_show_exists(flags: dict[str, set[str]]) -> None:
    wrong = set()
    for page in PAGES:
        for command, rest in invocations(text(page)):
            for flag in FLAG.findall(rest):
                if flag not in flags[command] and flag != "--help":
                    wrong.add(f"{page.name}: sebridge {command} {flag}")
    table_flags = set()
    for page in PAGES:
        for row in re.findall(r"^\| `(--[a-z][a-z0-9-]*)", text(page), re.M):
            table_flags.add((page.name, row))
    known = set().union(*flags.values())
    wrong |= {f"{page}: flag table row {flag}" for page, flag in table_flags if flag not in known}
    assert not wrong, sorted(wrong)


# --- app settings ----------------------------------------------------------------------------

# Settings of the Functions platform the docs name but the app's code does not read itself.
PLATFORM_SETTINGS = {
    "AzureWebJobsStorage",
    "AzureWebJobsStorage__accountName",
    "AzureWebJobsStorage__credential",
    "AzureWebJobsStorage__clientId",
    "FUNCTIONS_WORKER_RUNTIME",
    "FUNCTIONS_EXTENSION_VERSION",
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
    "PYTHON_THREADPOOL_THREAD_COUNT",
    "WEBSITE_HOSTNAME",
    "REQUESTS_CA_BUNDLE",
    "AZURE_CLIENT_ID",
}


class RecordingEnv(Mapping[str, str]):
    """An environment that is empty and remembers every name asked of it."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self.values = dict(values)
        self.asked: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.asked.add(name)
        return self.values[name]

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str):
            self.asked.add(name)
        return name in self.values

    def get(self, name: str, default: object = None) -> object:  # type: ignore[override]
        self.asked.add(name)
        return self.values.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)


def settings_the_app_reads() -> set[str]:
    """Every name ``load_settings`` asks for (with every optional part turned on, so its
    settings are asked too), and every ``%Setting%`` a trigger binds."""
    from functions.shared.settings import SettingsError, load_settings

    turned_on = {
        name: "true"
        for name in (
            "CUSTOM_SUBSCRIBER_ENABLED",
            "EVENTGRID_INGEST_ENABLED",
            "ACKNOWLEDGE_FALLBACK_ENABLED",
        )
    }
    env = RecordingEnv(turned_on)
    with contextlib.suppress(SettingsError):  # refused, after every name was asked
        load_settings(env)
    bound = set()
    for path in [REPO / "function_app.py", *(REPO / "functions").rglob("*.py")]:
        bound |= set(re.findall(r"[\"']%([A-Za-z]\w{2,})%[\"']", text(path)))
    return env.asked | bound


def documented_settings() -> set[str]:
    """The names in the first column of the configuration page's "App settings" tables."""
    page = text(DOCS / "configuration.md")
    section = page.split("\n## App settings", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([A-Za-z][A-Za-z0-9_]*)`", section, re.M))


def test_every_app_setting_is_documented() -> None:
    missing = sorted(settings_the_app_reads() - documented_settings() - PLATFORM_SETTINGS)
    assert not missing, f"app settings the configuration page's tables lack: {missing}"


def test_every_documented_app_setting_is_read() -> None:
    extra = sorted(documented_settings() - settings_the_app_reads() - PLATFORM_SETTINGS)
    assert not extra, f"documented app settings nothing reads: {extra}"


# --- Bicep parameters ------------------------------------------------------------------------


def bicep_parameters(template: Path) -> set[str]:
    return set(re.findall(r"^param (\w+)", text(template), re.M))


@pytest.mark.parametrize("template", ["main.bicep", "forwarder.bicep"])
def test_every_bicep_parameter_is_documented_and_exists(template: str) -> None:
    page = text(DOCS / "deploy.md")
    table = page.split(f"| Parameter (`{template}`)", 1)[1].split("\n\n", 1)[0]
    documented = set(re.findall(r"^\| `(\w+)` \|", table, re.M))
    assert documented == bicep_parameters(REPO / "infra" / template)


# --- metrics ---------------------------------------------------------------------------------


def exported_metrics() -> set[str]:
    """The metric families the forwarder registers (forwarder/observability/metrics.py), named
    as Prometheus exposes them (counters with ``_total``)."""
    source = text(REPO / "forwarder" / "observability" / "metrics.py")
    prefix = re.search(r'^PREFIX = "(\w+)"', source, re.M)
    assert prefix is not None
    names = set()
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        kind = getattr(node.func, "id", getattr(node.func, "attr", ""))
        kind = {"CounterMetricFamily": "Counter", "GaugeMetricFamily": "Gauge"}.get(kind, kind)
        if kind not in {"Counter", "Gauge", "Histogram", "Info", "Summary"}:
            continue
        first = node.args[0]
        if isinstance(first, ast.JoinedStr):
            literal = "".join(
                v.value if isinstance(v, ast.Constant) else prefix.group(1) for v in first.values
            )
        elif isinstance(first, ast.Constant):
            literal = str(first.value)
        else:
            continue
        suffix = {"Counter": "_total", "Info": "_info"}.get(kind, "")
        names.add(literal + suffix)
    return names


def test_the_metrics_check_finds_the_metrics() -> None:
    assert {"sebridge_forwarder_polls_total", "sebridge_forwarder_outbox_depth"} <= (
        exported_metrics()
    )


def test_every_metric_is_documented_and_every_documented_one_exists() -> None:
    page = text(DOCS / "monitoring.md")
    documented = set(re.findall(r"`(sebridge_forwarder_\w+)`", page))
    exported = exported_metrics()
    assert not sorted(exported - documented), "metrics the monitoring page lacks"
    assert not sorted(documented - exported), "documented metrics the forwarder lacks"


# --- links -----------------------------------------------------------------------------------


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    found = set()
    fenced = False
    for line in text(page).split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            title = re.sub(r"[^\w\- ]", "", title)
            found.add(title.replace(" ", "-"))
    return found


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", text(page)):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


def test_the_readme_is_a_summary() -> None:
    """The README stays a summary: what it is, try it, choose a mode, deploy, operate, the
    index; the reference is in docs/."""
    lines = text(REPO / "README.md").count("\n")
    assert lines <= 260, f"README.md has {lines} lines"
    for page in sorted(DOCS.glob("*.md")):
        assert f"docs/{page.name}" in text(REPO / "README.md"), f"the index lacks {page.name}"
