"""Run azure-servicebus's own test suite against the local Service Bus emulator.

    .venv/bin/python tests/peer/run.py [--subset ci] [--timeout 180] [-k EXPR] [--keep-logs]

1. downloads the source distribution of the installed azure-servicebus (``pip download
   --no-deps --no-binary :all:``) into tests/peer/.cache/ (gitignored), once;
2. copies its tests/ to tests/peer/.cache/run/ and replaces only the live-test harness: the
   preparers (servicebus_preparer.py, sb_env_loader.py), devtools_testutils, the test-proxy
   conftest.py, and azure.mgmt.servicebus.models (imported for AccessRights), with shims over
   peer_harness.py (every test gets a fresh emulator with the entities its preparers declare);
3. runs the sync tests (tests/test_*.py) with pytest, a per-test timeout and the exclusions of
   tests/peer/exclusions.toml (each with its reason), and prints: passed, failed (the emulator
   differs from Service Bus, with known_differences.toml's explanation where there is one),
   excluded (by reason), and what the suite itself skips.

Exit status: 0 when no non-excluded test failed, 1 otherwise, 2 when the suite could not run.
``--subset ci`` runs only the tests listed in tests/peer/ci_subset.txt (make peer-suite-ci).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# PEER_CACHE_DIR: another cache (two runs at once must not share the staged copy and results)
CACHE = Path(os.environ.get("PEER_CACHE_DIR") or HERE / ".cache")
EXCLUSIONS = HERE / "exclusions.toml"
KNOWN = HERE / "known_differences.toml"
SUBSETS = {"ci": HERE / "ci_subset.txt"}
PACKAGE = "azure-servicebus"

SHIMS = HERE / "shims"  # copied over the SDK's harness files (see stage())
RENAMED = {"conftest_shim.py": "conftest.py", "pytest_ini.txt": "pytest.ini"}


def installed_version() -> str:
    return importlib.metadata.version(PACKAGE)


def source_tests(version: str) -> Path:
    """The SDK's tests/ from its source distribution, downloaded and unpacked once."""
    unpacked = CACHE / f"azure_servicebus-{version}"
    tests = unpacked / "tests"
    if tests.is_dir():
        return tests
    CACHE.mkdir(parents=True, exist_ok=True)
    archives = list(CACHE.glob(f"azure_servicebus-{version}.tar.gz"))
    if not archives:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        command += ["--no-binary", ":all:", f"{PACKAGE}=={version}", "-d", str(CACHE)]
        print(f"downloading the {PACKAGE} {version} source distribution ...", flush=True)
        subprocess.run(command, check=True, timeout=300)
        archives = list(CACHE.glob(f"azure_servicebus-{version}.tar.gz"))
        if not archives:
            raise SystemExit(f"peer suite: pip download left no azure_servicebus-{version}.tar.gz")
    with tarfile.open(archives[0]) as archive:
        members = [m for m in archive.getmembers() if "/tests/" in f"/{m.name}"]
        archive.extractall(CACHE, members=members, filter="data")
    if not tests.is_dir():
        raise SystemExit(f"peer suite: the {version} source distribution has no tests/")
    return tests


def stage(tests: Path) -> Path:
    """A fresh copy of the SDK's tests/ with the live-test harness replaced."""
    run = CACHE / "run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(tests, run)
    for name in ("servicebus_preparer.py", "sb_env_loader.py", "conftest.py"):
        (run / name).unlink(missing_ok=True)
    for source in sorted(SHIMS.rglob("*")):
        if source.is_dir() or "__pycache__" in source.parts:
            continue
        relative = source.relative_to(SHIMS)
        target = run / relative.parent / RENAMED.get(relative.name, relative.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    shutil.copy2(HERE / "peer_harness.py", run / "peer_harness.py")
    return run


def _patterns(path: Path, table: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = tomllib.loads(path.read_text()).get(table, [])
    return entries


def run_pytest(run: Path, args: argparse.Namespace) -> tuple[dict[str, Any], int, float]:
    results = CACHE / "results.jsonl"
    results.unlink(missing_ok=True)
    logs = CACHE / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    # whole files the suite cannot import here are left out of collection (exclusions.toml)
    skipped_files = {
        e["pattern"] for e in _patterns(EXCLUSIONS, "exclude") if "::" not in e["pattern"]
    }
    files = sorted(p.name for p in run.glob("test_*.py") if p.name not in skipped_files)
    command = [sys.executable, "-m", "pytest", *files, "-c", str(run / "pytest.ini")]
    command += ["-q", f"--timeout={args.timeout}", "-o", "console_output_style=classic"]
    if args.k:
        command += ["-k", args.k]
    env = dict(os.environ)
    env.update(
        PEER_EXCLUSIONS=str(EXCLUSIONS),
        PEER_RESULTS=str(results),
        PEER_LOG_DIR=str(logs),
        PEER_REPO=str(REPO),
        PYTHONPATH=os.pathsep.join([str(run), str(REPO)]),
        TEST_PYAMQP="true",
        PYTHONUNBUFFERED="1",
    )
    if args.subset:
        env["PEER_SUBSET"] = str(SUBSETS[args.subset])
    started = time.monotonic()
    print(f"running pytest on {len(files)} files in {run} ...", flush=True)
    output = CACHE / "pytest-output.txt"
    cut_short = False
    with output.open("w") as sink:
        # its own session: on the deadline the whole group goes (pytest and its emulators)
        process = subprocess.Popen(
            command, cwd=run, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            process.wait(timeout=args.deadline)
        except subprocess.TimeoutExpired:
            cut_short = True
            _stop_group(process)
    wall = time.monotonic() - started
    text = output.read_text(errors="replace")
    if (
        not results.exists()
        or "error during collection" in text
        or "errors during collection" in text
    ):
        print(text[-5000:])
        raise SystemExit(f"peer suite: the suite did not run (pytest exit {process.returncode})")
    found: dict[str, Any] = {}
    for line in results.read_text().splitlines():
        entry = json.loads(line)
        found[entry.pop("nodeid")] = entry
    if cut_short:
        print(f"peer suite: stopped at the {args.deadline} s deadline", flush=True)
        for entry in found.values():
            if entry["outcome"] == "not run":
                entry.update(outcome="failed", detail=f"not run: the {args.deadline} s deadline")
    return found, process.returncode, wall


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM pytest and its emulators (one process group), then SIGKILL what is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)  # anyone left in the group?
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


def report(results: dict[str, Any], wall: float, version: str, subset: str | None) -> int:
    known = [(k["pattern"], k["reason"]) for k in _patterns(KNOWN, "known")]
    results = {k: v for k, v in results.items() if v["outcome"] != "not run"}  # deselected
    by_outcome: dict[str, list[str]] = collections.defaultdict(list)
    for nodeid, entry in results.items():
        outcome = entry["outcome"]
        if outcome == "error":
            outcome = "failed"
        by_outcome[outcome].append(nodeid)
    total = len(results)
    file_exclusions = [e for e in _patterns(EXCLUSIONS, "exclude") if "::" not in e["pattern"]]
    scope = f"CI subset ({SUBSETS[subset].name})" if subset else "tests/test_*.py (sync)"
    print()
    print(f"azure-servicebus {version} test suite against the emulator: {scope}")
    print(f"  total collected:  {total}   (wall time {wall / 60:.1f} min)")
    print(f"  passed:           {len(by_outcome['passed'])}")
    failed = sorted(by_outcome["failed"])
    print(f"  failed:           {len(failed)}   (the emulator differs from Service Bus)")
    for nodeid in failed:
        reason = next((r for p, r in known if _match(nodeid, p)), None)
        print(f"    - {nodeid}")
        print(f"        {results[nodeid].get('detail', '')[:300]}")
        if reason:
            print(f"        known difference: {reason}")
    excluded = by_outcome["excluded"]
    print(f"  excluded:         {len(excluded)}   (tests/peer/exclusions.toml)")
    reasons = collections.Counter(results[n]["reason"] for n in excluded)
    for reason, count in reasons.most_common():
        print(f"    {count:4d}  {reason}")
    for entry in file_exclusions:
        print(f"       -  {entry['pattern']} (whole file, not collected): {entry['reason']}")
    own = by_outcome["skipped"] + by_outcome["xfailed"] + by_outcome["xpassed"]
    print(f"  skipped or xfail by the suite's own markers: {len(own)}")
    for nodeid in sorted(own):
        print(f"    - {nodeid}: {results[nodeid]['outcome']} {results[nodeid].get('detail', '')}")
    polluters = sorted(n for n, e in results.items() if e.get("left_patched"))
    if polluters:
        print("  tests that left the SDK monkeypatched (undone by the harness before the next):")
        for nodeid in polluters:
            print(f"    - {nodeid}: {', '.join(results[nodeid]['left_patched'])}")
    print("  not run here: async_tests/ (needs pytest-asyncio), mgmt_tests/ (the HTTP management")
    print("  API, which the emulator does not serve), unittests/ and perf_tests/ (no service)")
    return 1 if failed else 0


def _match(nodeid: str, pattern: str) -> bool:
    import fnmatch

    return fnmatch.fnmatchcase(nodeid, pattern)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subset", choices=sorted(SUBSETS), default=None)
    parser.add_argument("--timeout", type=int, default=180, help="seconds per test")
    parser.add_argument("-k", default=None, help="pytest -k expression (a partial run)")
    parser.add_argument(
        "--deadline", type=float, default=None, help="stop the whole run after this many seconds"
    )
    args = parser.parse_args(argv)
    version = installed_version()
    try:
        run = stage(source_tests(version))
    except (OSError, subprocess.SubprocessError, tarfile.TarError) as exc:
        print(f"peer suite: cannot prepare the {PACKAGE} {version} tests: {exc}", file=sys.stderr)
        return 2
    results, _code, wall = run_pytest(run, args)
    print(f"pytest output: {CACHE / 'pytest-output.txt'}; emulator logs: {CACHE / 'logs'}")
    return report(results, wall, version, args.subset)


if __name__ == "__main__":
    sys.exit(main())
