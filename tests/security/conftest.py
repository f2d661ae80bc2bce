"""Fixtures for the security tests: certificates made here, servers on TLS ports, passwords.

Every server is the harness's own (never the machine's RabbitMQ or Redis) and knows
:data:`SECRET`, the password the tests then look for in everything a run leaves behind.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_beetle.testing.rabbit import rabbitmq_server_binary, start_all
from celery_beetle.testing.redis_server import redis_server_binary
from tests.conftest import _server_missing, _start_timeout
from tests.harness.tls import Certificates, TlsRabbitNode, TlsRedisServer, make_certificates

pytestmark = pytest.mark.integration

#: the password of the RabbitMQ user and of Redis: it must appear in no output
SECRET = "s3cret-Pw-4e1d9c"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    pytest.importorskip("cryptography")
    return make_certificates(tmp_path_factory.mktemp("certs"))


def _need(binary: object, what: str) -> None:
    if binary is None:
        _server_missing(what)


@pytest.fixture(scope="module")
def tls_nodes(
    certs: Certificates, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[TlsRabbitNode]]:
    """Two RabbitMQ nodes with TLS listeners and the good certificate."""
    _need(rabbitmq_server_binary(), "rabbitmq-server")
    nodes = [
        TlsRabbitNode(tmp_path_factory.mktemp(f"tls-rabbit{i}"), certs.ca, certs.good, SECRET)
        for i in range(2)
    ]
    try:
        start_all(nodes, timeout=_start_timeout())
        yield nodes
    finally:
        for node in nodes:
            node.kill()


@pytest.fixture(scope="module")
def tls_redis(
    certs: Certificates, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsRedisServer]:
    _need(redis_server_binary(), "redis-server")
    server = TlsRedisServer(tmp_path_factory.mktemp("tls-redis"), certs.ca, certs.good, SECRET)
    try:
        server.start()
        yield server
    finally:
        server.kill()


@pytest.fixture
def wrong_redis(certs: Certificates, tmp_path: Path) -> Iterator[TlsRedisServer]:
    """A Redis whose certificate names another host."""
    _need(redis_server_binary(), "redis-server")
    server = TlsRedisServer(tmp_path / "wrong-redis", certs.ca, certs.wrong, SECRET)
    try:
        server.start()
        yield server
    finally:
        server.kill()
        shutil.rmtree(tmp_path / "wrong-redis", ignore_errors=True)
