"""The forwarder installer, run for real in a throwaway root (SEBRIDGE_ROOT=tmp_path).

The steps that change the running system (pip, systemctl) are skipped with their flags; the
files it writes are the real ones, and `systemd-analyze verify --root` checks the unit we ship
against a root where its ExecStart exists. The system user is created for real, but inside the
throwaway root (useradd --root), and only where that is possible (as root): the running
system's account files are compared before and after.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from infra_helpers import INFRA, REPO, parse

from sebridge.timing import DEFAULT_PROBE_MIN_HEALTHY_SECONDS, MAX_PROBE_MIN_HEALTHY_SECONDS
from tests.support.root import NEEDS_ROOT, requires_root

SCRIPT = INFRA / "scripts" / "install-forwarder.sh"
UNIT = INFRA / "scripts" / "sebridge-forwarder.service"
UNIT_PATH = "etc/systemd/system/sebridge-forwarder.service"
ENV_PATH = "etc/sebridge/forwarder.env"
LINK_PATH = "usr/local/sbin/sebridge"
NAMESPACE = "sbns-prod-abc123.servicebus.windows.net"
CLIENT_ID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
SKIP_SYSTEM = ["--no-start", "--no-user", "--no-pip"]


def run_installer(
    root: Path, env: dict[str, str], *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SEBRIDGE_ROOT": str(root), **env}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def read_env_file(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs[key] = value
    return pairs


def unit_directives(text: str) -> list[tuple[str, str]]:
    """(key, value) in order; systemd allows repeated keys, so no dict/configparser."""
    return [
        (k.strip(), v.strip())
        for line in text.splitlines()
        if "=" in line and not line.lstrip().startswith(("#", ";", "["))
        for k, _, v in [line.partition("=")]
    ]


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    proc = run_installer(
        root,
        {
            "SEBRIDGE_NAMESPACE": NAMESPACE,
            "AZURE_CLIENT_ID": CLIENT_ID,
            "SEBRIDGE_LOG_FORMAT": "json",
            "SEBRIDGE_HEARTBEAT_INTERVAL": "120",
        },
        *SKIP_SYSTEM,
    )
    assert proc.returncode == 0, proc.stderr
    return root


def test_installer_writes_the_unit_and_the_configuration(installed: Path) -> None:
    unit = installed / UNIT_PATH
    assert unit.read_bytes() == UNIT.read_bytes()
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644
    env_file = installed / ENV_PATH
    # Readable by root and the service's group only.
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o640
    assert read_env_file(env_file) == {
        "SEBRIDGE_NAMESPACE": NAMESPACE,
        "AZURE_CLIENT_ID": CLIENT_ID,
        "SEBRIDGE_STATE_DIR": "/var/lib/sebridge",
        "SEBRIDGE_LOG_FORMAT": "json",
        "SEBRIDGE_HEARTBEAT_INTERVAL": "120",
    }
    # Nothing else: no venv (--no-pip), no stray temp file.
    written = sorted(
        p.relative_to(installed).as_posix() for p in installed.rglob("*") if p.is_file()
    )
    assert written == [ENV_PATH, UNIT_PATH]
    # `sudo sebridge ...` finds the command: sudo's secure_path holds /usr/local/sbin.
    link = installed / LINK_PATH
    assert link.is_symlink()
    assert os.readlink(link) == "/opt/sebridge/venv/bin/sebridge"


def test_the_forwarder_accepts_the_written_configuration(installed: Path) -> None:
    config_module = REPO / "forwarder" / "config.py"
    if not config_module.exists():
        pytest.fail("forwarder/config.py is missing: cannot check the installed configuration")
    from sebridge.forwarder.config import parse_config

    config = parse_config([], read_env_file(installed / ENV_PATH))
    assert config.namespace == NAMESPACE
    assert config.client_id == CLIENT_ID
    assert config.state_dir == Path("/var/lib/sebridge")
    assert config.log_format == "json"
    assert config.heartbeat_interval == 120
    assert config.connection_string is None


def test_installer_knows_every_setting_the_forwarder_reads() -> None:
    script = SCRIPT.read_text()
    passthrough = set(re.search(r'readonly PASSTHROUGH="([^"]+)"', script).group(1).split())
    fixed = {"SEBRIDGE_NAMESPACE", "AZURE_CLIENT_ID", "SEBRIDGE_STATE_DIR"}
    config_module = REPO / "forwarder" / "config.py"
    # The flags of the local actions (hooks, drain probe) are declared beside them, and the
    # Service Bus connection flags (shared with sebridge approve) in the Service Bus module.
    local_flags = REPO / "forwarder" / "local" / "settings.py"
    connection_flags = REPO / "sebridge" / "servicebus.py"
    sources = config_module.read_text() + local_flags.read_text() + connection_flags.read_text()
    read = set(re.findall(r'"(SEBRIDGE_[A-Z_]+|AZURE_CLIENT_ID)"', sources))
    assert read, "forwarder/config.py reads no SEBRIDGE_* setting?"
    # A connection string is a secret and the namespace has local auth off: never installed.
    assert read - {"SEBRIDGE_CONNECTION_STRING"} == passthrough | fixed


def test_the_link_is_kept_on_rerun_and_a_file_of_someone_else_is_left_alone(
    installed: Path, tmp_path: Path
) -> None:
    env = {"SEBRIDGE_NAMESPACE": NAMESPACE, "AZURE_CLIENT_ID": CLIENT_ID}
    again = run_installer(installed, env, *SKIP_SYSTEM)
    assert again.returncode == 0, again.stderr
    assert os.readlink(installed / LINK_PATH) == "/opt/sebridge/venv/bin/sebridge"
    other = tmp_path / "other"
    (other / "usr" / "local" / "sbin").mkdir(parents=True)
    (other / LINK_PATH).write_text("#!/bin/sh\necho mine\n")
    proc = run_installer(other, env, *SKIP_SYSTEM)
    assert proc.returncode == 0, proc.stderr
    assert (other / LINK_PATH).read_text() == "#!/bin/sh\necho mine\n"
    assert "exists and is not a link: left as it is" in proc.stdout


def test_rerun_updates_the_configuration_in_place(installed: Path) -> None:
    proc = run_installer(
        installed,
        {"SEBRIDGE_NAMESPACE": "sbns-other.servicebus.windows.net", "AZURE_CLIENT_ID": CLIENT_ID},
        *SKIP_SYSTEM,
    )
    assert proc.returncode == 0, proc.stderr
    values = read_env_file(installed / ENV_PATH)
    assert values["SEBRIDGE_NAMESPACE"] == "sbns-other.servicebus.windows.net"
    assert "SEBRIDGE_LOG_FORMAT" not in values  # the file is rewritten, not appended to
    assert sorted(p.name for p in (installed / "etc" / "sebridge").iterdir()) == ["forwarder.env"]


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        ({"AZURE_CLIENT_ID": CLIENT_ID}, SKIP_SYSTEM, "SEBRIDGE_NAMESPACE is required"),
        ({"SEBRIDGE_NAMESPACE": NAMESPACE}, SKIP_SYSTEM, "AZURE_CLIENT_ID is required"),
        (
            {
                "SEBRIDGE_NAMESPACE": "https://x.servicebus.windows.net",
                "AZURE_CLIENT_ID": CLIENT_ID,
            },
            SKIP_SYSTEM,
            "must be a host name",
        ),
        ({"SEBRIDGE_NAMESPACE": NAMESPACE, "AZURE_CLIENT_ID": "not-a-guid"}, SKIP_SYSTEM, "GUID"),
        (
            {
                "SEBRIDGE_NAMESPACE": NAMESPACE,
                "AZURE_CLIENT_ID": CLIENT_ID,
                "SEBRIDGE_CONNECTION_STRING": "Endpoint=sb://localhost/;SharedAccessKeyName=x",
            },
            SKIP_SYSTEM,
            "managed identity",
        ),
        (
            {
                "SEBRIDGE_NAMESPACE": NAMESPACE,
                "AZURE_CLIENT_ID": CLIENT_ID,
                "SEBRIDGE_VM_NAME": "vm1\nSEBRIDGE_NAMESPACE=evil.example",
            },
            SKIP_SYSTEM,
            "SEBRIDGE_VM_NAME contains characters",
        ),
        (
            {
                "SEBRIDGE_NAMESPACE": NAMESPACE,
                "AZURE_CLIENT_ID": CLIENT_ID,
                "SEBRIDGE_STATE_DIR": "/tmp/s",
            },
            SKIP_SYSTEM,
            "SEBRIDGE_STATE_DIR must be /var/lib/sebridge",
        ),
        (
            {"SEBRIDGE_NAMESPACE": NAMESPACE, "AZURE_CLIENT_ID": CLIENT_ID},
            ["--no-user", "--no-pip"],
            "SEBRIDGE_ROOT needs --no-start",
        ),
        (
            {"SEBRIDGE_NAMESPACE": NAMESPACE, "AZURE_CLIENT_ID": CLIENT_ID},
            [*SKIP_SYSTEM, "--bogus"],
            "unknown option",
        ),
        # No default package: the bare name on PyPI is not ours. Dies before pip or useradd
        # (and should that regress, pip finds no index rather than reaching the network).
        (
            {"SEBRIDGE_NAMESPACE": NAMESPACE, "AZURE_CLIENT_ID": CLIENT_ID, "PIP_NO_INDEX": "1"},
            ["--no-start", "--no-user"],
            "SEBRIDGE_PACKAGE is required",
        ),
        (
            {
                "SEBRIDGE_NAMESPACE": NAMESPACE,
                "AZURE_CLIENT_ID": CLIENT_ID,
                "SEBRIDGE_PACKAGE": "HTTP://pkgs.example.com/sebridge.whl",
            },
            SKIP_SYSTEM,
            "must not use http://",
        ),
        (
            {
                "SEBRIDGE_NAMESPACE": NAMESPACE,
                "AZURE_CLIENT_ID": CLIENT_ID,
                "SEBRIDGE_PACKAGE": "https://deploy:hunter2@pkgs.example.com/sebridge.whl",
            },
            SKIP_SYSTEM,
            "must not carry credentials",
        ),
    ],
    ids=[
        "no-namespace",
        "no-client-id",
        "namespace-url",
        "client-id-not-guid",
        "connection-string",
        "newline-injection",
        "state-dir",
        "root-needs-no-start",
        "unknown-option",
        "no-package",
        "package-over-http",
        "package-with-credentials",
    ],
)
def test_installer_refuses_bad_input_before_writing(
    tmp_path: Path, env: dict[str, str], args: list[str], message: str
) -> None:
    proc = run_installer(tmp_path, env, *args)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert list(tmp_path.iterdir()) == [], "nothing may be written on bad input"
    # Secrets are never echoed back.
    assert "SharedAccessKeyName" not in proc.stdout + proc.stderr
    assert "hunter2" not in proc.stdout + proc.stderr


def test_help_documents_the_interface() -> None:
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0
    for word in (
        "SEBRIDGE_NAMESPACE",
        "AZURE_CLIENT_ID",
        "SEBRIDGE_PACKAGE",
        "SEBRIDGE_ROOT",
        "--no-pip",
    ):
        assert word in proc.stdout


# --- the unit ---------------------------------------------------------------------------------


def test_unit_runs_the_installed_forwarder_with_hardening() -> None:
    directives = unit_directives(UNIT.read_text())
    values: dict[str, list[str]] = {}
    for key, value in directives:
        values.setdefault(key, []).append(value)
    script = SCRIPT.read_text()
    assert "readonly PREFIX=/opt/sebridge" in script and 'readonly VENV="$PREFIX/venv"' in script
    assert values["ExecStart"] == ["/opt/sebridge/venv/bin/sebridge forwarder"]
    assert values["User"] == ["sebridge"] and "readonly SERVICE_USER=sebridge" in script
    assert values["EnvironmentFile"][0] == "/etc/sebridge/forwarder.env"
    assert 'readonly ENV_FILE="$CONF_DIR/forwarder.env"' in script
    expected = {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "StateDirectory": "sebridge",
        "Restart": "always",
        "CapabilityBoundingSet": "",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
    }
    for key, value in expected.items():
        assert values.get(key) == [value], key
    assert int(values["RestartSec"][0]) >= 1


@pytest.fixture
def verify_root(installed: Path, systemd_units_dir: Path) -> Path:
    """The installed root plus system units and a stand-in for the venv's entry point."""
    units = installed / "usr" / "lib" / "systemd"
    units.mkdir(parents=True)
    shutil.copytree(systemd_units_dir, units / "system", symlinks=True)
    entry = installed / "opt" / "sebridge" / "venv" / "bin" / "sebridge"
    entry.parent.mkdir(parents=True)
    entry.write_text("#!/bin/sh\nexit 0\n")
    entry.chmod(0o755)
    return installed


def _verify(systemd_analyze: str, root: Path, unit: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [systemd_analyze, "verify", f"--root={root}", f"/{unit}"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_systemd_analyze_verify_accepts_the_installed_unit(
    systemd_analyze: str, verify_root: Path
) -> None:
    proc = _verify(systemd_analyze, verify_root, UNIT_PATH)
    # verify exits 0 on unknown keys too (it only warns), so any output is a failure.
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "" and proc.stderr.strip() == "", proc.stderr


def test_systemd_analyze_verify_catches_a_broken_unit(
    systemd_analyze: str, verify_root: Path
) -> None:
    """Control: the same check reports a typo and a missing ExecStart, so it really verifies."""
    broken = verify_root / "etc/systemd/system/sebridge-broken.service"
    broken.write_text(
        UNIT.read_text()
        .replace("NoNewPrivileges=yes", "NoNewPrivilege=yes")
        .replace("/opt/sebridge/venv/bin/sebridge", "/opt/sebridge/venv/bin/missing")
    )
    proc = _verify(systemd_analyze, verify_root, "etc/systemd/system/sebridge-broken.service")
    output = proc.stdout + proc.stderr
    assert "NoNewPrivilege" in output
    assert "missing" in output


def test_unit_exposure_is_low(systemd_analyze: str, verify_root: Path) -> None:
    proc = subprocess.run(
        [systemd_analyze, "security", "--offline=yes", f"--root={verify_root}", f"/{UNIT_PATH}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", proc.stdout)
    assert match, proc.stdout[-500:]
    assert float(match.group(1)) <= 2.0, proc.stdout


# --- the Custom Script Extension command ----------------------------------------------------


def _render_install_command(namespace: str, client_id: str, package: str, **optional: str) -> str:
    """forwarder.bicep's installCommand with its interpolations done as ARM would."""
    tree = parse(INFRA / "forwarder.bicep")
    variables = tree["variables"]
    template = variables["installCommand"]["value"]
    files = {}
    for name in ("scriptBase64", "unitBase64"):
        load = variables[name]["value"]["function"]
        assert load["type"] == "load_file_as_base64"
        path = INFRA / next(iter(load["parameters"].values()))
        files[name] = base64.b64encode(path.read_bytes()).decode()
    b64 = {
        "serviceBusNamespace": namespace,
        "forwarderIdentityClientId": client_id,
        "packageSource": package,
        "hooksJson": optional.get("hooksJson", ""),
        "drainProbePortText": optional.get("drainProbePortText", ""),
        "drainSecondsText": optional.get("drainSecondsText", ""),
        "drainLead": optional.get("drainLead", ""),
        "drainProbeMaxUnhealthyText": optional.get("drainProbeMaxUnhealthyText", ""),
        "drainProbeMinHealthyText": optional.get("drainProbeMinHealthyText", ""),
    }
    rendered = template
    for name, value in files.items():
        rendered = rendered.replace("${" + name + "}", value)
    for name, value in b64.items():
        rendered = rendered.replace(
            "${base64(" + name + ")}", base64.b64encode(value.encode()).decode()
        )
    assert "${" not in rendered, rendered
    return rendered


def test_extension_command_ships_this_commits_files_and_quotes_safely(tmp_path: Path) -> None:
    # A spec with shell metacharacters: it must reach pip verbatim.
    package = "scheduled-events-bridge>=0.1,<0.2; python_version >= '3.11'"
    command = _render_install_command(NAMESPACE, CLIENT_ID, package)
    assert command.endswith("bash install-forwarder.sh")
    root = tmp_path / "root"
    root.mkdir()
    work = tmp_path / "extension"
    work.mkdir()
    # Run it like the extension (sh -c, in its working directory), but into the test root.
    proc = subprocess.run(
        ["sh", "-c", f"{command} {' '.join(SKIP_SYSTEM)}"],
        cwd=work,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SEBRIDGE_ROOT": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"package: {package}\n" in proc.stdout
    assert (work / "sebridge" / "install-forwarder.sh").read_bytes() == SCRIPT.read_bytes()
    assert (root / UNIT_PATH).read_bytes() == UNIT.read_bytes()
    values = read_env_file(root / ENV_PATH)
    assert values["SEBRIDGE_NAMESPACE"] == NAMESPACE
    assert values["AZURE_CLIENT_ID"] == CLIENT_ID


def test_extension_keeps_the_command_in_protected_settings() -> None:
    for name in ("forwarder-vm.bicep", "forwarder-vmss.bicep"):
        tree = parse(INFRA / "modules" / name)
        (installer,) = [r for r in tree["resources"].values() if r["type"].endswith("/extensions")]
        props = installer["config"]["properties"]
        assert props["publisher"] == "Microsoft.Azure.Extensions"
        assert props["type"] == "CustomScript"
        assert props["protectedSettings"] == {"commandToExecute": "installCommand"}
        assert "settings" not in props


def test_package_source_has_no_default() -> None:
    """The project is not on PyPI: a default name there would install whoever claims it."""
    param = parse(INFRA / "forwarder.bicep")["parameters"]["packageSource"]
    assert param.get("default") is None
    assert {"type": "min_length", "argument": 1} in param["decorators"]  # '' fails validation
    script = SCRIPT.read_text()
    assert 'package="${SEBRIDGE_PACKAGE:-}"' in script
    assert "DEFAULT_PACKAGE" not in script


# --- the system user, inside the throwaway root -------------------------------------------------

# useradd --root chroots into the directory, which needs root; the Custom Script Extension
# runs as root. Where useradd is missing or we are not root, there is nothing safe to run.
SYSTEM_PATH = f"{os.environ.get('PATH', '/usr/bin:/bin')}:/usr/sbin:/sbin"
needs_useradd = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd", path=SYSTEM_PATH) is None,
    reason=f"{NEEDS_ROOT}: useradd --root needs root and useradd",
)
HOST_ACCOUNT_FILES = [Path("/etc") / name for name in ("passwd", "group", "shadow", "gshadow")]


@pytest.fixture
def host_accounts_untouched() -> Iterator[None]:
    """Fails the test if the running system's account files changed during it."""
    before = {p: p.read_bytes() for p in HOST_ACCOUNT_FILES if p.exists()}
    yield
    after = {p: p.read_bytes() for p in HOST_ACCOUNT_FILES if p.exists()}
    assert after == before, "the installer changed this machine's accounts"


def _fresh_image_root(tmp_path: Path) -> Path:
    """A throwaway root with the account files of a fresh image (root only)."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    return root


def _account(path: Path, name: str) -> list[list[str]]:
    return [
        line.split(":") for line in path.read_text().splitlines() if line.startswith(name + ":")
    ]


@needs_useradd
@pytest.mark.usefixtures("host_accounts_untouched")
def test_installer_creates_the_user_in_the_root_and_reruns_idempotently(tmp_path: Path) -> None:
    root = _fresh_image_root(tmp_path)
    env = {"SEBRIDGE_NAMESPACE": NAMESPACE, "AZURE_CLIENT_ID": CLIENT_ID, "PATH": SYSTEM_PATH}
    # Without --no-user: the user is created, inside the root.
    first = run_installer(root, env, "--no-start", "--no-pip")
    assert first.returncode == 0, first.stderr
    assert "created system user sebridge" in first.stdout
    passwd, group = root / "etc" / "passwd", root / "etc" / "group"
    ((_, _, uid, gid, _, home, shell),) = _account(passwd, "sebridge")
    assert home == "/var/lib/sebridge" and shell.endswith("/nologin")
    assert int(uid) < 1000, "a system user"
    ((_, _, group_id, _),) = _account(group, "sebridge")
    assert group_id == gid
    env_file = root / ENV_PATH
    assert (env_file.stat().st_uid, env_file.stat().st_gid) == (0, int(gid))
    accounts = (passwd.read_bytes(), group.read_bytes())

    # A rerun (the extension reruns on every change) finds the user and changes nothing.
    second = run_installer(root, env, "--no-start", "--no-pip")
    assert second.returncode == 0, second.stderr
    assert "user sebridge exists" in second.stdout
    assert (passwd.read_bytes(), group.read_bytes()) == accounts
    assert env_file.stat().st_gid == int(gid)


# --- hooks and the drain probe (issue 16) -------------------------------------------------------

HOOKS_PATH = "etc/sebridge/hooks.json"
HOOKS_JSON = (
    '{"schemaVersion": 1, "hooks": [{"name": "checkpoint", "on": ["Scheduled"], '
    '"command": ["/usr/local/bin/checkpoint", "--reason=$(reboot) `x` \\"q\\""], "prepare": true}]}'
)


def install_hooks(tmp_path: Path) -> Path:
    """Run the installer with hooks and the drain probe into a throwaway root; its root."""
    root = tmp_path / "root"
    root.mkdir()
    os.chmod(tmp_path, 0o755)
    proc = run_installer(
        root,
        {
            "SEBRIDGE_NAMESPACE": NAMESPACE,
            "AZURE_CLIENT_ID": CLIENT_ID,
            "SEBRIDGE_HOOKS_JSON": HOOKS_JSON,
            "SEBRIDGE_DRAIN_PROBE_PORT": "8642",
            "SEBRIDGE_DRAIN_SECONDS": "25",
        },
        *SKIP_SYSTEM,
    )
    assert proc.returncode == 0, proc.stderr
    return root


def test_installer_ships_the_hooks_file_and_names_it(tmp_path: Path) -> None:
    root = install_hooks(tmp_path)
    hooks = root / HOOKS_PATH
    assert hooks.read_text() == HOOKS_JSON + "\n"
    assert stat.S_IMODE(hooks.stat().st_mode) == 0o644
    values = read_env_file(root / ENV_PATH)
    assert values["SEBRIDGE_HOOKS_FILE"] == "/etc/sebridge/hooks.json"
    assert values["SEBRIDGE_DRAIN_PROBE_PORT"] == "8642"
    assert values["SEBRIDGE_DRAIN_SECONDS"] == "25"
    # Rerun without hooks: the configuration names no hooks file any more.
    proc = run_installer(
        root, {"SEBRIDGE_NAMESPACE": NAMESPACE, "AZURE_CLIENT_ID": CLIENT_ID}, *SKIP_SYSTEM
    )
    assert proc.returncode == 0, proc.stderr
    values = read_env_file(root / ENV_PATH)
    assert "SEBRIDGE_HOOKS_FILE" not in values and "SEBRIDGE_DRAIN_PROBE_PORT" not in values


@requires_root("the installer's hooks file is root-owned only when root runs it")
def test_installer_ships_a_hooks_file_only_root_can_change(tmp_path: Path) -> None:
    from sebridge.forwarder.local.hooks_file import load_hooks

    hooks = install_hooks(tmp_path) / HOOKS_PATH
    st = hooks.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o644)
    # The forwarder's own check (root-owned, not writable by others) accepts what it wrote.
    (hook,) = load_hooks(hooks).hooks
    assert hook.command[1] == '--reason=$(reboot) `x` "q"'


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"SEBRIDGE_HOOKS_JSON": "{not json"}, "SEBRIDGE_HOOKS_JSON is not JSON"),
        ({"SEBRIDGE_HOOKS_JSON": "{}", "SEBRIDGE_HOOKS_FILE": "/etc/x.json"}, "not both"),
        ({"SEBRIDGE_HOOKS_JSON": "[" + " " * 70_000 + "]"}, "larger than 65536"),
        (
            {"SEBRIDGE_DRAIN_PROBE_UPSTREAM": "http://127.0.0.1:8080/h?x=$(id)"},
            "SEBRIDGE_DRAIN_PROBE_UPSTREAM contains",
        ),
    ],
)
def test_installer_refuses_bad_hooks_before_writing(
    tmp_path: Path, env: dict[str, str], problem: str
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    proc = run_installer(
        root, {"SEBRIDGE_NAMESPACE": NAMESPACE, "AZURE_CLIENT_ID": CLIENT_ID, **env}, *SKIP_SYSTEM
    )
    assert proc.returncode != 0
    assert problem in proc.stderr
    assert not any(p.is_file() for p in root.rglob("*")), "wrote something before refusing"


def test_installer_validates_hooks_with_the_installed_forwarder(tmp_path: Path) -> None:
    """With a venv in place (here: a stand-in for /opt/sebridge/venv that runs this checkout),
    a hooks file the forwarder would refuse is not installed."""
    root = tmp_path / "root"
    venv_bin = root / "opt" / "sebridge" / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(Path(sys.executable))
    bad = '{"hooks": [{"name": "x", "on": ["Scheduled"], "command": ["checkpoint"]}]}'
    env = {
        "SEBRIDGE_NAMESPACE": NAMESPACE,
        "AZURE_CLIENT_ID": CLIENT_ID,
        "SEBRIDGE_HOOKS_JSON": bad,
        "PYTHONPATH": str(REPO),
    }
    proc = run_installer(root, env, *SKIP_SYSTEM)
    assert proc.returncode != 0
    assert "absolute path" in proc.stderr and "not a valid hooks file" in proc.stderr
    assert not (root / HOOKS_PATH).exists()
    env["SEBRIDGE_HOOKS_JSON"] = bad.replace('["checkpoint"]', '["/usr/local/bin/checkpoint"]')
    proc = run_installer(root, env, *SKIP_SYSTEM)
    assert proc.returncode == 0, proc.stderr
    assert (root / HOOKS_PATH).exists()


def test_extension_command_ships_the_hooks_file_and_probe_settings_verbatim(tmp_path: Path) -> None:
    command = _render_install_command(
        NAMESPACE,
        CLIENT_ID,
        "scheduled-events-bridge==0.2.0",
        hooksJson=HOOKS_JSON,
        drainProbePortText="8642",
        drainSecondsText="40",
        drainLead="Reboot=600,Freeze=first-sight",
        drainProbeMaxUnhealthyText="480",
        drainProbeMinHealthyText="120",
    )
    root = tmp_path / "root"
    root.mkdir()
    work = tmp_path / "extension"
    work.mkdir()
    proc = subprocess.run(
        ["sh", "-c", f"{command} {' '.join(SKIP_SYSTEM)}"],
        cwd=work,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SEBRIDGE_ROOT": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert (root / HOOKS_PATH).read_text() == HOOKS_JSON + "\n"
    values = read_env_file(root / ENV_PATH)
    assert (
        values["SEBRIDGE_DRAIN_PROBE_PORT"] == "8642" and values["SEBRIDGE_DRAIN_SECONDS"] == "40"
    )
    assert values["SEBRIDGE_DRAIN_LEAD"] == "Reboot=600,Freeze=first-sight"
    assert values["SEBRIDGE_DRAIN_PROBE_MAX_UNHEALTHY_SECONDS"] == "480"
    assert values["SEBRIDGE_DRAIN_PROBE_MIN_HEALTHY_SECONDS"] == "120"
    # Left empty (the defaults), nothing about hooks or the probe is configured.
    plain = _render_install_command(NAMESPACE, CLIENT_ID, "scheduled-events-bridge==0.2.0")
    root2 = tmp_path / "root2"
    root2.mkdir()
    proc = subprocess.run(
        ["sh", "-c", f"{plain} {' '.join(SKIP_SYSTEM)}"],
        cwd=work,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SEBRIDGE_ROOT": str(root2)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert not (root2 / HOOKS_PATH).exists()
    assert not {
        "SEBRIDGE_HOOKS_FILE",
        "SEBRIDGE_DRAIN_PROBE_PORT",
        "SEBRIDGE_DRAIN_LEAD",
        "SEBRIDGE_DRAIN_PROBE_MAX_UNHEALTHY_SECONDS",
        "SEBRIDGE_DRAIN_PROBE_MIN_HEALTHY_SECONDS",
    } & set(read_env_file(root2 / ENV_PATH))


def test_forwarder_bicep_hooks_and_probe_parameters_are_optional() -> None:
    params = parse(INFRA / "forwarder.bicep")["parameters"]
    assert params["hooksJson"]["default"] == ""
    assert params["drainProbePort"]["default"] == 0
    assert params["drainSeconds"]["default"] == 30
    assert params["drainLead"]["default"] == ""
    assert params["drainProbeMaxUnhealthySeconds"]["default"] == 510
    assert params["drainProbeMinHealthySeconds"]["default"] == DEFAULT_PROBE_MIN_HEALTHY_SECONDS
    text = (INFRA / "forwarder.bicep").read_text()
    # The same range as the forwarder's own check: a value Bicep lets through is never refused
    # at the VM, where the failure would only show in the unit's journal.
    assert f"@maxValue({MAX_PROBE_MIN_HEALTHY_SECONDS})\nparam drainProbeMinHealthySeconds" in text


def test_unit_is_type_notify_with_a_watchdog_above_the_slowest_healthy_poll() -> None:
    """Issue 14: READY/WATCHDOG/STATUS come from the main process's poll loop; the watchdog
    and the start timeout both exceed the first IMDS call's 125 s deadline (a healthy first
    poll, or a poll tick before IMDS has answered once, is never taken for a stuck loop)."""
    from sebridge.forwarder.imds.client import FIRST_CALL_READ_TIMEOUT

    values: dict[str, list[str]] = {}
    for key, value in unit_directives(UNIT.read_text()):
        values.setdefault(key, []).append(value)
    assert values["Type"] == ["notify"]
    assert values["NotifyAccess"] == ["main"]
    watchdog = int(values["WatchdogSec"][0])
    start = int(values["TimeoutStartSec"][0])
    assert watchdog > FIRST_CALL_READ_TIMEOUT + 10
    assert start > FIRST_CALL_READ_TIMEOUT + 10
    assert "AF_UNIX" in values["RestrictAddressFamilies"][0].split()  # the notify socket
    assert values["Restart"] == ["always"]  # a watchdog kill is restarted


def test_installer_passes_the_metrics_settings_through(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    proc = run_installer(
        root,
        {
            "SEBRIDGE_NAMESPACE": NAMESPACE,
            "AZURE_CLIENT_ID": CLIENT_ID,
            "SEBRIDGE_METRICS_PORT": "9464",
            "SEBRIDGE_METRICS_ADDRESS": "127.0.0.1",
        },
        *SKIP_SYSTEM,
    )
    assert proc.returncode == 0, proc.stderr
    env = (root / "etc" / "sebridge" / "forwarder.env").read_text().splitlines()
    assert "SEBRIDGE_METRICS_PORT=9464" in env
    assert "SEBRIDGE_METRICS_ADDRESS=127.0.0.1" in env
