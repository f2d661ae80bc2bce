"""Replays past the dedup window, and copies of one message dead-lettered apart, on real
brokers, a real Redis and a real worker (:mod:`celery_beetle.ops.replay`).

A record lives until its message's expiry plus the workers' margin; a dead letter lives until
someone removes it. These tests make the window short (a message expiry of seconds, a margin
of one second) so that it ends within the test: Redis expires keys on its own clock.
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import contextmanager

import pytest
from click.testing import CliRunner

from celery_beetle.cli import main
from celery_beetle.ops.dead_letters import list_dead_letters
from celery_beetle.ops.management import clients_for_url
from celery_beetle.ops.policies import PolicyConfig, apply
from celery_beetle.ops.replay import kombu_publisher, replay
from celery_beetle.store import RedisStore
from celery_beetle.testing.waiting import wait_until
from kombu_beetle.envelope import EXPIRES_AT_HEADER, FLAGS_HEADER
from tests.exactly_once.conftest import FAST, counts
from tests.exactly_once.poison import celery_queue_empty, publish_raw, task_body
from tests.exactly_once.test_replay import dead_letter_count, give_up
from tests.ops.conftest import management_config

pytestmark = pytest.mark.integration

#: the workers keep a record one second past its message's expiry (the default is an hour)
SHORT_MARGIN = {"extra_env": {"BEETLE_TEST_CONF": json.dumps({"beetle_key_ttl_margin": 1})}}


@pytest.fixture
def store(redis_url):  # type: ignore[no-untyped-def]
    s = RedisStore.from_url(redis_url)
    yield s
    s.close()


def ttl_policy(brokers, ttl_by_node: dict[int, int]) -> None:  # type: ignore[no-untyped-def]
    """Declare ``celery`` on every node and give it, per node, a message TTL (ms) through
    the queue's policy (which also dead-letters to ``celery.dead``)."""
    for node in brokers.nodes:
        conn = node.connect(brokers.vhost)
        conn.channel().queue_declare("celery", durable=True)
        conn.close()
    clients = clients_for_url(brokers.beetle_url, management_config(brokers))
    for index, client in enumerate(clients):
        ttl = ttl_by_node.get(index)
        queues = {"celery": {"message_ttl_ms": ttl}} if ttl is not None else {}
        apply([client], ["celery"], PolicyConfig.from_mapping({"queues": queues}))


def no_ttl(brokers) -> None:  # type: ignore[no-untyped-def]
    apply(
        clients_for_url(brokers.beetle_url, management_config(brokers)),
        ["celery"],
        PolicyConfig(),
    )


def publish_copy(brokers, node: int, message_id: str, item: int, expires_at_s: int) -> None:  # type: ignore[no-untyped-def]
    """One copy of a redundant message, on one node, as the transport writes it."""
    publish_raw(
        brokers.nodes[node], brokers.vhost, body=task_body(item), message_id=message_id,
        **{EXPIRES_AT_HEADER: expires_at_s, FLAGS_HEADER: 1},
    )  # fmt: skip


def cli(env, *args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, list(args), env=env)


def test_a_dead_letter_whose_twin_completed_is_refused_after_the_record_expired_and_force_runs_it(
    brokers, eo_worker, redis_url, store
):
    """One copy expires on its broker (a queue TTL), the twin runs and completes; once the
    completed record has expired, nothing in the store says the message ran, so a replay
    refuses it (and ``dead list`` says so) until ``--force``."""
    ttl_policy(brokers, {0: 100})
    message_id = f"twin-{uuid.uuid4().hex[:8]}"
    expires_at_s = int(time.time()) + 20  # long enough for a worker to start and run it
    publish_copy(brokers, 0, message_id, 51, expires_at_s)
    assert wait_until(lambda: dead_letter_count(brokers) == 1, 10)
    no_ttl(brokers)
    worker = eo_worker(**SHORT_MARGIN)
    publish_copy(brokers, 1, message_id, 51, expires_at_s)  # the twin
    assert wait_until(lambda: counts([worker])[51] == 1, 15)
    assert wait_until(lambda: store.peek("celery", message_id) is None, 30), "record expired"

    env = {"BEETLE_BROKER_URL": brokers.beetle_url, "BEETLE_REDIS_URL": redis_url}
    listed = cli(env, "dead", "list", "-Q", "celery", "--json")
    assert listed.exit_code == 0, listed.output
    (entry,) = json.loads(listed.output)
    assert entry["replay"] == "refused", entry
    assert "dedup window ended" in entry["replay_reason"]
    table = cli(env, "dead", "list", "-Q", "celery")
    assert (
        "refused [1]" in table.output
        and f"[1] {message_id}: refused, its dedup window ended" in table.output
    ), table.output

    refused = cli(env, "dead", "replay", "-Q", "celery", "--all")
    assert refused.exit_code == 1, refused.output
    assert f"{message_id}  eo.record  refused: " in refused.output
    assert "--force" in refused.output
    assert dead_letter_count(brokers) == 1, "a refused dead letter stays"
    assert counts([worker])[51] == 1

    # a worker that ran the twin remembers its completion in memory and would drop the
    # forced copy as a duplicate; a day later the workers are others
    worker.stop()
    later = eo_worker(**SHORT_MARGIN)
    forced = cli(env, "dead", "replay", "-Q", "celery", "--all", "--force")
    assert forced.exit_code == 0, forced.output
    assert f"{message_id}  eo.record  run: " in forced.output
    assert wait_until(lambda: counts([later])[51] == 1, 15), "--force runs it"
    assert dead_letter_count(brokers) == 0


def test_a_replay_resumed_after_its_copy_s_dedup_window_is_refused(
    brokers, client, eo_worker, store, tmp_path
):
    """A replay killed after its publish, resumed once the replayed run's record expired:
    the store cannot tell that run from none, so the resumed replay refuses to publish again."""
    broken = tmp_path / "broken"
    broken.touch()
    worker = eo_worker(extra_env={"BEETLE_TEST_BROKEN": str(broken), **SHORT_MARGIN["extra_env"]})
    (task_id,) = give_up(client(), worker, brokers, [52])
    broken.unlink()
    short = {**FAST, "message_ttl": 3}  # the replayed copy expires in 3 s

    @contextmanager
    def dies_after_publishing():  # type: ignore[no-untyped-def]
        with kombu_publisher(brokers.beetle_url, short) as publish:

            def publish_then_die(letter, headers):  # type: ignore[no-untyped-def]
                publish(letter, headers)
                raise KeyboardInterrupt  # killed before the mark and the ack

            yield publish_then_die

    with pytest.raises(KeyboardInterrupt):
        replay(
            brokers.beetle_url, "celery", store, everything=True,
            transport_options=short, publisher=dies_after_publishing(),
        )  # fmt: skip
    assert wait_until(lambda: counts([worker])[52] == 1, 15)
    assert wait_until(lambda: store.peek("celery", task_id) is None, 15), "record expired"

    results = replay(brokers.beetle_url, "celery", store, everything=True, transport_options=FAST)
    assert [r.outcome for r in results] == ["refused"]
    assert "dedup window" in results[0].detail and "--force" in results[0].detail
    assert dead_letter_count(brokers) == 2, "the dead letter stays"
    assert counts([worker])[52] == 1


def test_copies_of_one_message_dead_lettered_at_different_seconds_are_one_dead_letter(
    brokers, client, eo_worker, redis_url, store
):
    """The brokers dead-letter the two copies 1.4 s apart (staggered queue TTLs), so their
    ``x-death`` times are different seconds: still one entry, shown once, replayed once."""
    ttl_policy(brokers, {0: 100, 1: 1500})
    message_id = f"apart-{uuid.uuid4().hex[:8]}"
    for node in (0, 1):
        publish_copy(brokers, node, message_id, 53, int(time.time()) + 3600)
    assert wait_until(lambda: dead_letter_count(brokers) == 2, 10)
    letters, errors = list_dead_letters(brokers.beetle_url, "celery")
    assert errors == {}
    assert [(d.message_id, len(d.copies)) for d in letters] == [(message_id, 2)]

    env = {"BEETLE_BROKER_URL": brokers.beetle_url, "BEETLE_REDIS_URL": redis_url}
    shown = cli(env, "dead", "show", "-Q", "celery", message_id)
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["message_id"] == message_id, "one dead letter, not a list"

    no_ttl(brokers)
    worker = eo_worker()
    results = replay(brokers.beetle_url, "celery", store, everything=True, transport_options=FAST)
    assert [(r.outcome, len(r.letter.copies), r.acked) for r in results] == [("run", 2, True)]
    assert wait_until(lambda: counts([worker])[53] == 1, 15)
    assert wait_until(lambda: celery_queue_empty(brokers), 15)
    assert dead_letter_count(brokers) == 0
    assert counts([worker], "start")[53] == 1
