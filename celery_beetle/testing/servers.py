"""Where test servers run: local binaries or containers, chosen once per pytest session.

- containers (:mod:`.containers`, testcontainers) when a Docker engine answers a ping within a
  second and has or can pull the images; ``BEETLE_TEST_SERVERS=containers`` insists on it and
  stops the run if either is missing. kill is ``docker kill``, pause is ``docker pause``,
  restart starts the same container again.
- local otherwise, or with ``BEETLE_TEST_SERVERS=local``: the installed ``rabbitmq-server``
  and ``redis-server``; a missing binary skips the test, and fails it under ``CI=true`` so
  that CI cannot go green by skipping.

Both kinds have one interface (:class:`.rabbit.RabbitNode`, :class:`.redis_server.RedisServer`;
the container classes subclass them), so fixtures and fault helpers never ask which it is.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_beetle.testing.rabbit import (
    RabbitNode,
    RabbitNodeError,
    rabbitmq_server_binary,
    start_all,
)
from celery_beetle.testing.redis_server import RedisServer, redis_server_binary

__all__ = [
    "BACKENDS",
    "backend",
    "choose_backend",
    "discard",
    "fresh_redis",
    "fresh_vhost",
    "heal_nodes",
    "new_rabbit",
    "new_redis",
    "server_missing",
    "start_timeout",
    "use_containers",
]

BACKENDS = ("auto", "local", "containers")
#: seconds for a node to answer: ~5 s locally; a container's first boot also unpacks its image
LOCAL_START_TIMEOUT, CONTAINER_START_TIMEOUT = 60, 120

#: vhosts the fixtures create start with it; one a killed node kept is deleted at restart
TEST_VHOST_PREFIX = "test-"

_chosen: str | None = None


def choose_backend(wanted: str | None = None) -> tuple[str, str]:
    """Choose (once; later calls return the same) and return ``(backend, reason)``.

    ``wanted`` defaults to ``BEETLE_TEST_SERVERS`` (``auto``); a forced but missing engine
    raises :class:`pytest.UsageError`, which stops the run before any test.
    """
    global _chosen
    if wanted is None:
        wanted = os.environ.get("BEETLE_TEST_SERVERS", "auto").strip().lower() or "auto"
    if wanted not in BACKENDS:
        raise pytest.UsageError(f"BEETLE_TEST_SERVERS={wanted!r}: expected one of {BACKENDS}")
    _chosen, reason = _choose(wanted)
    return _chosen, reason


def _choose(wanted: str) -> tuple[str, str]:
    if wanted == "local":
        return "local", "BEETLE_TEST_SERVERS=local"
    try:
        from celery_beetle.testing.containers import (
            RABBITMQ_IMAGE,
            REDIS_IMAGE,
            docker_engine,
            missing_images,
            prepare_engine,
        )
    except ImportError as exc:  # testcontainers / docker not installed
        if wanted == "containers":
            raise pytest.UsageError(f"BEETLE_TEST_SERVERS=containers, but {exc}")
        return "local", f"no testcontainers: {exc.name}"
    engine = docker_engine(timeout=1.0)
    if engine is None:
        if wanted == "containers":
            raise pytest.UsageError(
                "BEETLE_TEST_SERVERS=containers, but no Docker engine answers "
                f"(DOCKER_HOST={os.environ.get('DOCKER_HOST', 'unset')})"
            )
        return "local", "no Docker engine answers"
    missing = missing_images(engine)
    if missing:
        engine.close()
        what = f"a Docker engine answers, but cannot pull {', '.join(missing)}"
        if wanted == "containers":
            raise pytest.UsageError(f"BEETLE_TEST_SERVERS=containers: {what}")
        return "local", what
    note = prepare_engine(engine)
    engine.close()
    return "containers", "; ".join(filter(None, [f"{RABBITMQ_IMAGE}, {REDIS_IMAGE}", note]))


def backend() -> str:
    """The chosen backend; chooses now (from the environment) if nobody did."""
    return _chosen if _chosen is not None else choose_backend()[0]


def use_containers() -> bool:
    return backend() == "containers"


def start_timeout() -> float:
    return CONTAINER_START_TIMEOUT if use_containers() else LOCAL_START_TIMEOUT


def new_rabbit(base_dir: Path) -> RabbitNode:
    """A RabbitMQ node (not started) of the chosen backend."""
    if use_containers():
        from celery_beetle.testing.containers import RabbitContainer

        return RabbitContainer(base_dir)
    if rabbitmq_server_binary() is None:
        server_missing("rabbitmq-server")
    return RabbitNode(base_dir)


def new_redis(base_dir: Path, *, appendonly: bool = False) -> RedisServer:
    """A Redis server (not started) of the chosen backend."""
    if use_containers():
        from celery_beetle.testing.containers import RedisContainer

        return RedisContainer(base_dir, appendonly=appendonly)
    if redis_server_binary() is None:
        server_missing("redis-server")
    return RedisServer(base_dir, appendonly=appendonly)


def discard(server: RabbitNode | RedisServer) -> None:
    """Kill a server whose data is thrown away; a container is removed with its data, too."""
    if use_containers():
        server.remove()
    else:
        server.kill()


def server_missing(what: str) -> None:
    """Skip the test for want of ``what``; fail it under ``CI=true``."""
    message = f"{what} is not installed; integration tests need it"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: install it rather than skip)", pytrace=False)
    pytest.skip(message)


# -- session servers, made ready for the next test ---------------------------------------


def heal_nodes(nodes: list[RabbitNode]) -> None:
    """Unfreeze and restart what an earlier test froze or killed; drop the vhosts it left."""
    for node in nodes:
        if node.is_paused:
            node.resume()
    dead = [node for node in nodes if not node.is_running]
    start_all(dead, timeout=start_timeout())
    for node in dead:  # a test that killed it could not clean up its vhost
        for vhost in node.vhosts():
            if vhost.startswith(TEST_VHOST_PREFIX):
                node.delete_vhost(vhost)


@contextlib.contextmanager
def fresh_vhost(nodes: list[RabbitNode]) -> Iterator[str]:
    """Every node up, with a vhost of this test's own; the vhost is deleted after."""
    heal_nodes(nodes)
    vhost = f"{TEST_VHOST_PREFIX}{uuid.uuid4().hex[:12]}"
    for node in nodes:
        node.create_vhost(vhost)
    try:
        yield vhost
    finally:
        for node in nodes:
            if node.is_paused:
                node.resume()
            if node.is_running:
                with contextlib.suppress(RabbitNodeError, OSError):
                    node.delete_vhost(vhost)


def fresh_redis(server: RedisServer) -> RedisServer:
    """The server running, unfrozen, accepting writes, with an empty database."""
    if server.is_paused:
        server.resume()
    if not server.is_running:
        server.start()
    with server.client() as client:
        client.config_set("maxmemory", 0)  # a refusing_writes a test left behind
        client.flushall()
    return server
