"""Azurite, Microsoft's Azure Storage emulator, for blobs and tables on loopback.

The version is pinned in ``package.json`` / ``package-lock.json`` beside this file and installed
by the Makefile (``npm ci``) into ``node_modules/``. :class:`Azurite` starts it as a child
process the way the app meets Azure Storage:

- over **HTTPS** with a self-signed certificate made at start (for 127.0.0.1, ``::1`` and
  localhost), because Azurite takes bearer tokens only over HTTPS; clients trust it through
  ``REQUESTS_CA_BUNDLE`` (requests and azure-core read it), which :meth:`Azurite.environ` gives:
  a *combined* bundle, Azurite's certificate plus every certificate the environment already
  trusted (the bundle its ``REQUESTS_CA_BUNDLE`` names, else certifi's), so putting it in place
  of the environment's loses no trust (the functions host relies on that:
  emulators/functions_host/settings.py);
- with ``--oauth basic``: Entra bearer tokens, as the adapters send them; Azurite checks their
  audience, issuer and lifetime (not their signature), which the identity fake's JWT-shaped
  tokens carry (``emulators/fakes/identity.py``);
- on **port 0** for each service: Azurite binds, then prints the port it got
  (``Azurite Blob service is successfully listening at https://127.0.0.1:<port>``), which is
  read back here, so there is no window in which another process can take the port;
- loopback only, in memory (``--inMemoryPersistence``, bounded by ``--extentMemoryLimit``),
  no telemetry; stopped with SIGTERM (then SIGKILL) by :meth:`Azurite.stop`, and by the
  kernel when the process that started it dies, however it dies (``PR_SET_PDEATHSIG``, set in
  the child before node starts): Azurite never outlives its parent. Its temporary directory
  (the certificate and key) is then left behind under ``/tmp/sebridge-azurite-*``.

Accounts are path-style on an IP host: ``https://127.0.0.1:<port>/devstoreaccount1/<container>``
and ``https://127.0.0.1:<port>/devstoreaccount1/<table>``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ACCOUNT = "devstoreaccount1"
START_TIMEOUT = 60.0
MEMORY_LIMIT_MB = 256
_LISTENING = re.compile(
    r"Azurite (Blob|Queue|Table) service is successfully listening at (https?://\S+)"
)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel send the child SIGTERM when its parent dies
    (Linux's ``prctl(PR_SET_PDEATHSIG)``; None elsewhere). libc is resolved here, before the
    fork, so the child only makes the two system calls."""
    name = ctypes.util.find_library("c")
    if not name or os.uname().sysname != "Linux":
        return None
    prctl = ctypes.CDLL(name, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the call: nobody would signal
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def combined_bundle(cert: Path, path: Path) -> Path:
    """Write ``cert`` followed by the bundle the environment trusts (``REQUESTS_CA_BUNDLE``'s
    file when it names a readable one, else certifi's) to ``path``."""
    trusted = os.environ.get("REQUESTS_CA_BUNDLE") or ""
    if not trusted or not Path(trusted).is_file():
        import certifi

        trusted = certifi.where()
    text = cert.read_text(encoding="ascii").rstrip("\n") + "\n"
    with contextlib.suppress(OSError):
        text += Path(trusted).read_text(encoding="utf-8", errors="replace")
    path.write_text(text, encoding="utf-8")
    return path


class AzuriteUnavailable(RuntimeError):
    """Azurite is not installed here (``make install`` runs ``npm ci`` for it), or node is
    missing, or it did not start."""


def executable() -> Path:
    """The pinned Azurite's entry point (``node_modules/.bin/azurite``)."""
    path = Path(os.environ.get("SEBRIDGE_AZURITE", HERE / "node_modules" / ".bin" / "azurite"))
    if not path.exists():
        raise AzuriteUnavailable(
            f"Azurite is not installed ({path} is missing): run `make install`, which runs "
            "`npm ci --prefix emulators/azurite` (node 20 and npm are needed)"
        )
    if shutil.which("node") is None:
        raise AzuriteUnavailable("node is not on PATH (Azurite runs on node 20)")
    return path


class Azurite:
    """``with Azurite() as storage:`` blobs at ``storage.blob_endpoint``, tables at
    ``storage.table_endpoint``; ``storage.environ()`` for the processes that talk to it."""

    def __init__(self, *, oauth: bool = True) -> None:
        self.oauth = oauth
        self.blob_endpoint = ""
        self.table_endpoint = ""
        self.ca_bundle: Path | None = None
        self._dir: Path | None = None
        self._process: subprocess.Popen[str] | None = None
        self._output: list[str] = []
        self._ready = threading.Condition()

    def __enter__(self) -> Azurite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def container_url(self, name: str) -> str:
        return f"{self.blob_endpoint}/{name}"

    def table_url(self, name: str) -> str:
        return f"{self.table_endpoint}/{name}"

    def environ(self) -> dict[str, str]:
        """What a client process needs to trust the certificate (the combined bundle)."""
        return {"REQUESTS_CA_BUNDLE": str(self.ca_bundle)} if self.ca_bundle else {}

    def start(self) -> Azurite:
        if self._process is not None:
            return self
        from emulators.servicebus.tls import self_signed_certificate

        program = executable()
        self._dir = Path(tempfile.mkdtemp(prefix="sebridge-azurite-"))
        cert, key = self_signed_certificate(self._dir)
        scheme = "https"
        args = [
            str(program),
            *("--blobHost", "127.0.0.1", "--blobPort", "0"),
            *("--tableHost", "127.0.0.1", "--tablePort", "0"),
            *("--queueHost", "127.0.0.1", "--queuePort", "0"),
            "--inMemoryPersistence",
            *("--extentMemoryLimit", str(MEMORY_LIMIT_MB)),
            "--disableTelemetry",
            "--silent",
            *("--cert", str(cert), "--key", str(key)),
        ]
        if self.oauth:
            args += ["--oauth", "basic"]
        self.ca_bundle = combined_bundle(cert, self._dir / "ca-bundle.pem")
        self._process = subprocess.Popen(  # noqa: S603 - the pinned Azurite, no shell
            args,
            cwd=self._dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            # The death signal goes out when the *thread* that forked exits: start Azurite
            # from a thread that lives as long as it should (the main thread, a fixture's).
            preexec_fn=_die_with_parent(),
        )
        threading.Thread(target=self._pump, name="azurite-stdout", daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT
        with self._ready:
            while not (self.blob_endpoint and self.table_endpoint):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._process.poll() is not None:
                    output = "\n".join(self._output[-20:])
                    self.stop()
                    raise AzuriteUnavailable(f"Azurite did not start:\n{output}")
                self._ready.wait(min(remaining, 0.2))
        if not self.blob_endpoint.startswith(scheme):
            self.stop()
            raise AzuriteUnavailable("Azurite listens without TLS")
        return self

    def _pump(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            found = _LISTENING.search(line)
            with self._ready:
                self._output.append(line.rstrip())
                del self._output[:-200]
                if found:
                    service, url = found.groups()
                    if service == "Blob":
                        self.blob_endpoint = f"{url.rstrip('/')}/{ACCOUNT}"
                    elif service == "Table":
                        self.table_endpoint = f"{url.rstrip('/')}/{ACCOUNT}"
                self._ready.notify_all()
        with self._ready:
            self._ready.notify_all()

    def stop(self, grace: float = 10.0) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
