"""Real servers and network faults for integration and chaos tests.

`RabbitNode` and `RedisServer` run throwaway brokers and Redis from the installed binaries, each on
its own ports and data dir, so a test can kill -9, SIGSTOP or restart them by pid. `TcpProxy`
sits in front of a server to cut or stall its traffic. tests/conftest.py wraps them in fixtures.
`containers` (imported only where a Docker engine is used, so testcontainers stays optional) has
the same two in containers, for machines with an engine.
"""

from __future__ import annotations

from tests.harness.ports import free_port
from tests.harness.proxy import TcpProxy
from tests.harness.rabbit import (
    BrokerSet,
    RabbitNode,
    RabbitNodeError,
    beetle_url,
    rabbitmq_server_binary,
    start_all,
    stop_all,
)
from tests.harness.redis_server import RedisServer, RedisServerError, redis_server_binary

__all__ = [
    "BrokerSet",
    "RabbitNode",
    "RabbitNodeError",
    "RedisServer",
    "RedisServerError",
    "TcpProxy",
    "beetle_url",
    "free_port",
    "rabbitmq_server_binary",
    "redis_server_binary",
    "start_all",
    "stop_all",
]
