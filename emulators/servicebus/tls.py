"""A self-signed certificate for the emulator's optional TLS listeners, made at start.

Valid for 127.0.0.1, ::1, localhost (and any --tls-hostname) for one day; written with its key
to a private temporary directory. Clients trust it with ``connection_verify=<certificate path>``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def self_signed_certificate(
    directory: Path | None = None, hostnames: tuple[str, ...] = ()
) -> tuple[Path, Path]:
    """(certificate path, key path) of a fresh self-signed certificate; ``hostnames`` are
    extra DNS names it is valid for (e.g. a namespace's name mapped to loopback)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sebridge-servicebus-emulator")])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    *(x509.DNSName(name) for name in hostnames),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("::1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = directory or Path(tempfile.mkdtemp(prefix="sebridge-sb-tls-"))
    cert_path = folder / "emulator-cert.pem"
    key_path = folder / "emulator-key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(key_path, 0o600)
    return cert_path, key_path
