"""Which brokers a publish tries, and the declaration log: no server needed."""

from __future__ import annotations

from kombu_beetle.brokers import BrokerLink, BrokerSet
from kombu_beetle.declarations import DeclarationLog
from kombu_beetle.options import build_options


class FakeConn:
    connected = True

    def collect(self):
        self.connected = False


def make_set(strategy="round_robin", urls="h1,h2,h3", extra=None, clock=None):
    options = build_options(
        f"beetle://{urls}//",
        {"publish_strategy": strategy, "additional_subscription_brokers": extra or ""},
    )
    consume_only = set(options.all_brokers) - set(options.brokers)
    links = [
        BrokerLink(a, options, consume_only=a in consume_only, clock=clock or (lambda: 0.0))
        for a in options.all_brokers
    ]
    for link in links:
        link.conn = FakeConn()  # type: ignore[assignment]
    return BrokerSet(links, strategy), links


def names(links):
    return [link.name.split(":")[0] for link in links]


def test_round_robin_rotates_the_first_broker():
    brokers, _ = make_set()
    firsts = [names(brokers.candidates())[0] for _ in range(6)]
    assert firsts == ["h1", "h2", "h3", "h1", "h2", "h3"]


def test_primary_always_starts_at_the_first_live_broker_in_url_order():
    brokers, links = make_set("primary")
    assert {names(brokers.candidates())[0] for _ in range(5)} == {"h1"}
    links[0].fail(OSError("gone"))
    assert names(brokers.candidates()) == ["h2", "h3"]


def test_dead_brokers_are_skipped_and_retried_with_backoff():
    now = [100.0]
    brokers, links = make_set(clock=lambda: now[0])
    links[1].fail(OSError("reset"))
    assert "h2" not in names(brokers.candidates())
    assert links[1].next_retry_at == 101.0
    assert not links[1].due(100.5) and links[1].due(101.0)
    links[1]._schedule_retry()
    assert links[1].next_retry_at == 102.0  # 1 s, then 2 s, ... capped at 30 s


def test_subscription_only_brokers_never_get_a_publish():
    brokers, _ = make_set(extra="old1")
    for _ in range(4):
        assert "old1" not in names(brokers.candidates())
    assert "old1" in names(brokers.live())


def test_declaration_log_replays_in_order_and_forgets_deleted_entities():
    log = DeclarationLog()
    log.record("exchange_declare", {"exchange": "x", "type": "direct", "nowait": False})
    log.record("queue_declare", {"queue": "q", "durable": True})
    log.record("queue_bind", {"queue": "q", "exchange": "x", "routing_key": "q"})
    log.record("queue_declare", {"queue": "p", "passive": True})
    assert [d.method for d in log] == ["exchange_declare", "queue_declare", "queue_bind"]
    assert "nowait" not in next(iter(log)).args
    log.forget("queue_delete", {"queue": "q"})
    assert [d.method for d in log] == ["exchange_declare"]
