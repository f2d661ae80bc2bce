"""``beetle queues migrate``: a queue's type and arguments changed on every broker, its
messages and bindings kept, the state on record; ``--status``, ``--dry-run``, ``--resume``."""

from __future__ import annotations

import pika
import pytest
from click.testing import CliRunner

from celery_beetle.cli import main

pytestmark = pytest.mark.integration


def _args(brokers, redis_url):
    args = ["--broker", brokers.beetle_url, "--redis", redis_url, "--settle-s", "0.2"]
    for node in brokers.nodes:
        args += ["--management-url", f"{node.host_port}=http://{node.host}:{node.management_port}"]
    return args


def _classic_queue_with_messages(brokers, queue, count):
    for n, node in enumerate(brokers.nodes):
        with node.connect(brokers.vhost) as conn:
            ch = conn.channel()
            ch.exchange_declare("jobs-x", "direct", durable=True)
            ch.queue_declare(queue, durable=True)
            ch.queue_bind(queue, "jobs-x", routing_key="jobs-key")
            for i in range(count):
                ch.basic_publish(
                    "", queue, f"{n}-{i}".encode(), pika.BasicProperties(message_id=f"{n}-{i}")
                )


def _queue(node, vhost, name):
    return node._api("GET", f"/api/queues/{vhost.replace('/', '%2F')}/{name}")


def test_a_classic_queue_becomes_quorum_on_every_broker_with_its_messages_and_bindings(
    brokers, redis_url
):
    _classic_queue_with_messages(brokers, "jobs", 5)
    runner = CliRunner()
    result = runner.invoke(
        main,
        ["queues", "migrate", "-Q", "jobs", "--queue-type", "quorum", "--no-workers",
         *_args(brokers, redis_url)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for n, node in enumerate(brokers.nodes):
        assert node.queue_depths(brokers.vhost).get("jobs.beetle-migrating") is None
        bodies = sorted(body for _, _, body in node.get_messages(brokers.vhost, "jobs"))
        assert bodies == sorted(f"{n}-{i}".encode() for i in range(5))
        with node.connect(brokers.vhost) as conn:
            ch = conn.channel()
            # a redeclare with the new arguments is accepted: the queue is quorum now
            ch.queue_declare("jobs", durable=True, arguments={"x-queue-type": "quorum"})
            ch.basic_publish("jobs-x", "jobs-key", b"routed")  # the binding came back
        assert [b for _, _, b in node.get_messages(brokers.vhost, "jobs")] == [b"routed"]
    status = runner.invoke(
        main, ["queues", "migrate", "-Q", "jobs", "--status", *_args(brokers, redis_url)]
    )
    assert status.exit_code == 0, status.output
    assert "done" in status.output
    assert status.output.count("moved-back (moved 5 out, 5 back)") == 3


def test_dry_run_prints_the_plan_and_changes_nothing(brokers, redis_url):
    _classic_queue_with_messages(brokers, "jobs", 2)
    result = CliRunner().invoke(
        main,
        ["queues", "migrate", "-Q", "jobs", "--queue-type", "quorum", "--arg", "x-max-length=100",
         "--dry-run", *_args(brokers, redis_url)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert '{"x-max-length": 100, "x-queue-type": "quorum"}' in result.output
    assert "dry run: nothing changed" in result.output
    for node in brokers.nodes:
        assert node.queue_depths(brokers.vhost)["jobs"][0] == 2


def test_a_quorum_target_with_x_max_priority_is_refused_before_anything_changes(brokers, redis_url):
    for node in brokers.nodes:
        with node.connect(brokers.vhost) as conn:
            conn.channel().queue_declare("prio", durable=True, arguments={"x-max-priority": 9})
    result = CliRunner().invoke(
        main,
        ["queues", "migrate", "-Q", "prio", "--queue-type", "quorum", *_args(brokers, redis_url)],
    )
    assert result.exit_code == 1
    assert "--arg x-max-priority=" in result.output


def test_a_broker_down_at_the_start_is_refused_by_name(brokers, redis_url):
    _classic_queue_with_messages(brokers, "jobs", 1)
    brokers.nodes[2].pause()
    try:
        result = CliRunner().invoke(
            main,
            ["queues", "migrate", "-Q", "jobs", "--queue-type", "quorum", "--no-workers",
             *_args(brokers, redis_url)],
        )  # fmt: skip
    finally:
        brokers.nodes[2].resume()
    assert result.exit_code == 1, result.output
    assert brokers.nodes[2].host_port in result.output
    assert "every broker up" in result.output


def test_one_migration_process_per_queue_and_a_dead_ones_lease_runs_out(redis_url):
    from celery_beetle.ops.migrate import MigrationError, MigrationLock
    from celery_beetle.store import connect

    client = connect(redis_url)
    first = MigrationLock(client, "beetle:ops:migration:/:jobs:lock", ttl_s=1.0)
    first.acquire(wait_s=0)
    second = MigrationLock(client, "beetle:ops:migration:/:jobs:lock", ttl_s=1.0)
    with pytest.raises(MigrationError, match="another migration process"):
        second.acquire(wait_s=0.5, echo=lambda _: None)
    first._stop.set()  # as if killed -9: no more refreshes
    second.acquire(wait_s=5, echo=lambda _: None)  # the lease ran out
    assert client.get("beetle:ops:migration:/:jobs:lock") == second.owner
    second.release()
    assert client.get("beetle:ops:migration:/:jobs:lock") is None


def test_a_plain_consumer_of_the_queue_makes_the_migration_refuse_to_start(brokers, redis_url):
    from kombu import Connection, Consumer, Queue

    from celery_beetle.testing.waiting import wait_until

    _classic_queue_with_messages(brokers, "jobs", 0)
    url = brokers.nodes[0].amqp_url(brokers.vhost).replace("amqp://", "pyamqp://")
    with Connection(url) as plain:
        Consumer(plain.channel(), [Queue("jobs", durable=True)], callbacks=[]).consume()
        fleet = ["fleet", "-Q", "jobs", *_args(brokers, redis_url)[:2], *_args(brokers, "")[6:]]
        assert wait_until(lambda: CliRunner().invoke(main, fleet).exit_code == 2, 15)
        args = ["queues", "migrate", "-Q", "jobs", "--queue-type", "quorum", "--no-workers",
                *_args(brokers, redis_url)]  # fmt: skip
        result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert "upgrade them first, or --force" in result.output
    for node in brokers.nodes:
        info = _queue(node, brokers.vhost, "jobs")
        assert info["type"] == "classic", "nothing changed"


def test_a_quorum_queue_goes_back_to_classic_with_its_messages(brokers, redis_url):
    for node in brokers.nodes:
        with node.connect(brokers.vhost) as conn:
            ch = conn.channel()
            ch.queue_declare("jobs", durable=True, arguments={"x-queue-type": "quorum"})
            for i in range(3):
                ch.basic_publish("", "jobs", f"q{i}".encode())
    result = CliRunner().invoke(
        main,
        ["queues", "migrate", "-Q", "jobs", "--queue-type", "classic", "--no-workers",
         *_args(brokers, redis_url)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for node in brokers.nodes:
        assert _queue(node, brokers.vhost, "jobs")["type"] == "classic"
        bodies = sorted(body for _, _, body in node.get_messages(brokers.vhost, "jobs"))
        assert bodies == [b"q0", b"q1", b"q2"]


def test_a_migration_that_lost_its_lease_stops_before_its_next_step_and_the_resumed_one_wins(
    brokers, redis_url
):
    """The first process is paused (its lease runs out) right after it deleted the queue on
    the first broker; a second one resumes and finishes; the first, waking, must neither
    declare, move nor delete anything, nor save its stale state over the finished one."""
    import threading

    from celery_beetle.ops.management import clients_for_url
    from celery_beetle.ops.migrate import MigrationError, MigrationLock, Migrator, StateStore
    from celery_beetle.store import connect
    from celery_beetle.testing.waiting import wait_until
    from kombu_beetle.options import build_options
    from tests.ops.conftest import management_config

    _classic_queue_with_messages(brokers, "jobs", 5)
    options = build_options(brokers.beetle_url)
    clients = clients_for_url(brokers.beetle_url, management_config(brokers))
    store = StateStore(connect(redis_url))
    key = store.key(options.virtual_host, "jobs") + ":lock"
    first_broker = brokers.nodes[0].host_port
    paused, wake = threading.Event(), threading.Event()

    def first_echo(line: str) -> None:
        if line == f"{first_broker}: jobs drained":  # the queue is deleted there
            paused.set()
            wake.wait(60)

    first_lock = MigrationLock(store.client, key, ttl_s=1.0)
    first_lock.acquire(wait_s=0)
    first = Migrator(options, clients, store, None, echo=first_echo, settle_s=0.2,
                     lock=first_lock)  # fmt: skip
    state = first.plan("jobs", "quorum", {})
    store.save(state, first_lock)
    errors: list[BaseException] = []

    def run_first() -> None:
        try:
            first.run(state)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run_first, daemon=True)
    thread.start()
    assert paused.wait(30)
    first_lock._stop.set()  # as if SIGSTOPped: no more refreshes, the lease runs out
    assert wait_until(lambda: store.client.get(key) is None, timeout=10)

    second_lock = MigrationLock(store.client, key, ttl_s=10.0)
    second_lock.acquire(wait_s=5, echo=lambda _: None)
    try:
        resumed = store.load(options.virtual_host, "jobs")
        assert resumed is not None and resumed.steps[first_broker] == "drained"
        second = Migrator(options, clients, store, None, echo=lambda _: None, settle_s=0.2,
                          lock=second_lock)  # fmt: skip
        assert second.run(resumed).done
        wake.set()  # the first one wakes while the second still holds the lease
        thread.join(30)
    finally:
        second_lock.release()
    assert len(errors) == 1 and isinstance(errors[0], MigrationError), errors
    assert "lost the migration's lease" in str(errors[0])
    assert f"stopped before declaring jobs again on {first_broker}" in str(errors[0])
    saved = store.load(options.virtual_host, "jobs")
    assert saved is not None and saved.done, "the stale process saved nothing"
    for n, node in enumerate(brokers.nodes):
        assert _queue(node, brokers.vhost, "jobs")["type"] == "quorum"
        assert node.queue_depths(brokers.vhost).get("jobs.beetle-migrating") is None
        bodies = sorted(body for _, _, body in node.get_messages(brokers.vhost, "jobs"))
        assert bodies == sorted(f"{n}-{i}".encode() for i in range(5)), "nothing lost"
