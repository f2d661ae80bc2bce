"""TLS for the harness: a throwaway CA, server certificates, and TLS-listening servers.

:func:`make_certificates` writes a CA and two server certificates signed by it: ``good``
names ``localhost`` and ``127.0.0.1`` (what the tests connect to), ``wrong`` names
``wrong.example`` only, so a client that verifies host names must refuse it. A
:class:`TlsRabbitNode` listens for AMQP over TLS on ``tls_port`` beside its plain port (the
harness's readiness probe and management calls keep using that one), and starts with a user
whose password the tests look for in every log; a :class:`TlsRedisServer` does the same with
``--tls-port`` and ``--requirepass``.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from celery_beetle.testing.ports import free_port
from celery_beetle.testing.rabbit import RabbitNode
from celery_beetle.testing.redis_server import RedisServer


@dataclass(frozen=True)
class ServerCert:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Certificates:
    ca: Path
    good: ServerCert
    wrong: ServerCert


def make_certificates(directory: Path) -> Certificates:
    """A CA and two server certificates under ``directory`` (EC keys: fast to make)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=2)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def write_key(key: Any, path: Path) -> None:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        path.chmod(0o600)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name("beetle test CA"))
        .issuer_name(name("beetle test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path = directory / "ca.pem"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))

    def server(label: str, names: list[x509.GeneralName]) -> ServerCert:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(label))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
            .sign(ca_key, hashes.SHA256())
        )
        files = ServerCert(directory / f"{label}.pem", directory / f"{label}.key")
        files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        write_key(key, files.key)
        return files

    good = server(
        "good",
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    wrong = server("wrong", [x509.DNSName("wrong.example")])
    return Certificates(ca_path, good, wrong)


class TlsRabbitNode(RabbitNode):
    """A RabbitMQ node that also listens for AMQP over TLS on ``tls_port``, with a password,
    and (with the management plugin) for its HTTP API over TLS on ``management_tls_port``."""

    user = "beetle"

    def __init__(
        self, base_dir: Path, ca: Path, server: ServerCert, password: str, **kwargs: Any
    ) -> None:
        self.ca, self.server_cert, self.password = ca, server, password
        self.tls_port = free_port()
        self.management_tls_port = free_port()
        super().__init__(base_dir, **kwargs)

    def _write_config(self) -> None:
        super()._write_config()
        lines = [
            f"listeners.ssl.1 = {self.host}:{self.tls_port}",
            f"ssl_options.cacertfile = {self.ca}",
            f"ssl_options.certfile = {self.server_cert.cert}",
            f"ssl_options.keyfile = {self.server_cert.key}",
            "ssl_options.verify = verify_none",
            "ssl_options.fail_if_no_peer_cert = false",
            f"default_user = {self.user}",
            f"default_pass = {self.password}",
        ]
        if self.management_port is not None:
            lines += [
                f"management.ssl.ip = {self.host}",
                f"management.ssl.port = {self.management_tls_port}",
                f"management.ssl.cacertfile = {self.ca}",
                f"management.ssl.certfile = {self.server_cert.cert}",
                f"management.ssl.keyfile = {self.server_cert.key}",
            ]
        with (self.base_dir / "rabbitmq.conf").open("a") as conf:
            conf.write("\n".join(lines) + "\n")


class TlsRedisServer(RedisServer):
    """A redis-server with a password that also listens for TLS on ``tls_port``."""

    def __init__(self, base_dir: Path, ca: Path, server: ServerCert, password: str) -> None:
        self.password, self.ca = password, ca
        self.tls_port = free_port()
        super().__init__(
            base_dir,
            extra_args=[
                "--requirepass", password,
                "--tls-port", str(self.tls_port),
                "--tls-cert-file", str(server.cert),
                "--tls-key-file", str(server.key),
                "--tls-ca-cert-file", str(ca),
                "--tls-auth-clients", "no",
            ],
        )  # fmt: skip

    def client(self, **options: Any) -> redis.Redis:
        options.setdefault("password", self.password)
        return super().client(**options)
