"""Dedup identity without a server: record keys, scopes and where they travel.

Keys must be injective over every ``(scope, message_id)`` and capped in length; a scope
comes from the worker's mapping and reaches the record, the pool, trace events on both
sides, retries and dead letters.
"""

from __future__ import annotations

import random
from typing import Any

import amqp
import pytest
from celery import Celery

import celery_beetle
from celery_beetle.settings import BeetleSettings
from celery_beetle.store.keys import MAX_PLAIN_ID_CHARS, decode_key, legacy_key, record_key
from celery_beetle.store.state import MessageFacts
from celery_beetle.worker.deadletter import dead_letter_headers, publish_dead_letter
from celery_beetle.worker.facts import FACTS_HEADER, facts_from_headers
from celery_beetle.worker.retry_queue import RawMessage, publish_delayed
from celery_beetle.worker.runnable import request_facts
from kombu_beetle.envelope import FLAGS_HEADER
from kombu_beetle.errors import InvalidTransportOption
from kombu_beetle.options import build_options
from kombu_beetle.publish import Publisher
from kombu_beetle.scopes import SCOPE_HEADER, parse_dedup_scopes
from tests.unit.test_gate import LIMITS, Harness, Message
from tests.unit.test_publisher import FakeBrokers, FakeLink, FakeSub

PREFIX = "beetle:"
ALPHABET = "ab:{}#%1é"


def random_name(rng: random.Random, longest: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, longest)))


# Keys


def test_keys_are_injective_and_decode_back_on_random_names():
    rng = random.Random(9)
    pairs = {(random_name(rng, 6), random_name(rng, 8)) for _ in range(5_000)}
    pairs |= {(random_name(rng, 4), "x" * rng.randint(195, 260)) for _ in range(500)}
    keys: dict[str, tuple[str, str]] = {}
    for scope, message_id in pairs:
        key = record_key(PREFIX, scope, message_id)
        assert keys.setdefault(key, (scope, message_id)) == (scope, message_id), key
        decoded_scope, decoded_id, form = decode_key(PREFIX, key)
        assert decoded_scope == scope
        if form == "C":
            assert len(message_id) > MAX_PLAIN_ID_CHARS and len(decoded_id) == 64
        else:
            assert decoded_id == message_id
    assert len(keys) == len(pairs)


def test_plain_names_keep_the_previous_key_and_others_do_not_share_it():
    assert record_key(PREFIX, "celery", "6f1c-1a52") == "beetle:{celery:6f1c-1a52}"
    assert legacy_key(PREFIX, "celery", "6f1c-1a52") is None
    assert record_key(PREFIX, "a:b", "c") == "beetle:{a:b:c}#3"
    assert record_key(PREFIX, "a", "b:c") == "beetle:{a:b:c}#1"
    assert legacy_key(PREFIX, "a:b", "c") == legacy_key(PREFIX, "a", "b:c") == "beetle:{a:b:c}"
    long_id = "x" * 255
    assert record_key(PREFIX, "q", long_id).endswith("}%1")
    assert legacy_key(PREFIX, "q", long_id) == f"beetle:{{q:{long_id}}}"


def test_no_old_key_is_the_key_of_another_message():
    rng = random.Random(5)
    pairs = {(random_name(rng, 5), random_name(rng, 6)) for _ in range(5_000)}
    new_keys = {record_key(PREFIX, s, i) for s, i in pairs}
    old_keys = {legacy_key(PREFIX, s, i) for s, i in pairs} - {None}
    assert old_keys and not (old_keys & new_keys)


def test_keys_are_capped_in_length():
    longest = {record_key(PREFIX, "s" * 255, i) for i in ("i" * 1024, "i:" * 100, "i" * 200)}
    assert max(len(key) for key in longest) == len(PREFIX) + 462


@pytest.mark.parametrize("key", ["beetle:{a:b:c}", "beetle:{ab}", "other:{a:b}", "beetle:{a:b}#9"])
def test_text_that_no_record_has_is_not_decoded(key):
    with pytest.raises(ValueError):
        decode_key(PREFIX, key)


# Scopes: settings and options


def test_scopes_are_read_from_a_dict_or_a_string():
    expected = {"orders": "orders", "orders.v2": "orders"}
    assert parse_dedup_scopes(expected) == expected
    assert parse_dedup_scopes(" orders=orders , orders.v2=orders ,") == expected
    assert parse_dedup_scopes(None) == parse_dedup_scopes("") == {}


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("orders", "has no '='"),
        ({"orders": ""}, "non-empty string"),
        ({"orders": 3}, "non-empty string"),
        ({"orders": "s" * 256}, "at most 255"),
        ({"orders": "é" * 128}, "256 UTF-8 bytes"),
        ("a=x,a=y", "twice"),
        (["orders"], "dict"),
    ],
)
def test_bad_scopes_are_refused_with_what_is_wrong(value, error):
    with pytest.raises(ValueError, match=error):
        parse_dedup_scopes(value)
    with pytest.raises(ValueError, match=error):
        BeetleSettings("redis://localhost", dedup_scopes=value)


def test_the_transport_takes_scopes_in_the_url_and_in_its_options():
    assert build_options("beetle://h1//?dedup_scopes=q.v2=q").dedup_scopes == {"q.v2": "q"}
    options = build_options("beetle://h1//", {"dedup_scopes": {"q.v2": "q"}})
    assert options.dedup_scopes == {"q.v2": "q"}
    with pytest.raises(InvalidTransportOption, match="dedup_scopes"):
        build_options("beetle://h1//", {"dedup_scopes": "q.v2"})


def test_install_hands_the_worker_s_scopes_to_the_transport():
    app = Celery(broker="beetle://h1,h2//")
    app.conf.beetle_dedup_scopes = {"q.v2": "q"}
    celery_beetle.install(app)
    assert app.conf.broker_transport_options["dedup_scopes"] == {"q.v2": "q"}
    settings = BeetleSettings.from_app(Celery(config_source={"beetle_redis_url": "redis://x"}))
    assert settings.scope_of("q.v2") == "q.v2"


# Scopes in the worker


def test_copies_in_two_queues_of_one_scope_are_one_message_to_the_gate(h):
    h.gate.scopes = {"jobs.v2": "jobs"}
    assert h.deliver(Message()) == "run"
    new_queue = Message()
    new_queue.delivery_info["routing_key"] = "jobs.v2"
    assert h.deliver(new_queue) == "waiting"
    facts = facts_from_headers(new_queue.headers[FACTS_HEADER])
    assert facts == MessageFacts("jobs.v2", "m1", facts.expires_at_ms, scope="jobs")


def test_one_message_id_in_two_scopes_is_two_messages_to_the_gate(h):
    h.gate.scopes = {"jobs.billing": "billing"}
    assert h.deliver(Message()) == "run"
    other = Message()
    other.delivery_info["routing_key"] = "jobs.billing"
    assert h.deliver(other) == "run"


def test_a_completed_record_of_the_scope_drops_a_copy_from_the_other_queue(h):
    h.gate.scopes = {"jobs.v2": "jobs"}
    token = h.run_elsewhere()
    h.store.complete(h.facts(), token)
    copy = Message()
    copy.delivery_info["routing_key"] = "jobs.v2"
    assert h.deliver(copy) == "duplicate"


class Recorder:
    enabled = True

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def emit(self, event: str, message_id: str, **fields: Any) -> None:
        self.events.append((event, fields))


def test_gate_events_name_the_scope(h):
    h.rebuild(scopes={"jobs.v2": "jobs"}, tracer=(tracer := Recorder()))
    message = Message()
    message.delivery_info["routing_key"] = "jobs.v2"
    h.deliver(message)
    assert [fields["queue"] for _, fields in tracer.events] == ["jobs"]


def test_publish_events_name_the_scope_of_the_routing_key():
    subs = {name: FakeSub(name, []) for name in ("h1", "h2")}
    tracer = Recorder()
    publisher = Publisher(
        build_options("beetle://h1,h2//?dedup_scopes=work.v2=work"),
        FakeBrokers([FakeLink(name) for name in subs]),  # type: ignore[arg-type]
        tracer,  # type: ignore[arg-type]
        lambda link: subs[link.name],  # type: ignore[arg-type, return-value]
        lambda: None,
    )
    message = amqp.Message(b"body", application_headers={FLAGS_HEADER: 1}, message_id="m1")
    publisher.publish(message, "", "work.v2")
    assert [(event, fields["queue"]) for event, fields in tracer.events] == [
        ("published", "work"),
        ("published", "work"),
    ]


class Request:
    id = "task-1"
    delivery_info = {"routing_key": "jobs.v2"}
    properties = {"message_id": "m1", "application_headers": {}}


def test_the_pool_reads_the_scope_the_gate_found_or_works_it_out_alike():
    settings = BeetleSettings("redis://x", dedup_scopes={"jobs.v2": "jobs"})
    assert request_facts(Request(), settings).identity == ("jobs", "m1")
    request = Request()
    request.beetle_facts = {  # type: ignore[attr-defined]
        "queue": "jobs.v2",
        "scope": "other",
        "message_id": "m1",
        "expires_at_ms": 1,
    }
    assert request_facts(request, settings).identity == ("other", "m1")


# Scopes on retries and dead letters


class Producer:
    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []
        self.channel = self

    def queue_declare(self, **kwargs: Any) -> None:
        pass

    def publish(self, body: bytes, **kwargs: Any) -> None:
        self.published.append(kwargs)


def test_a_retry_goes_back_to_its_physical_queue_and_carries_its_scope():
    producer = Producer()
    raw = RawMessage(b"[]", "application/json", "utf-8", {"id": "t"}, {"message_id": "m1"})
    assert publish_delayed(producer, raw, "jobs.v2", 1_000, "jobs") == "jobs.v2.delay.1000"
    assert producer.published[0]["headers"][SCOPE_HEADER] == "jobs"
    publish_delayed(producer, raw, "jobs", 0)
    assert producer.published[1]["routing_key"] == "jobs"
    assert producer.published[1]["headers"][SCOPE_HEADER] == "jobs"


def test_a_dead_letter_names_its_queue_and_its_scope():
    producer = Producer()
    raw = RawMessage(b"[]", "application/json", "utf-8", {"id": "t"}, {"message_id": "m1"})
    headers = dead_letter_headers("not_retryable", "jobs.v2", scope="jobs")
    assert publish_dead_letter(producer, raw, "jobs.v2", headers) == "jobs.v2.dead"
    sent = producer.published[0]["headers"]
    assert (sent["x-beetle-dead-queue"], sent["x-beetle-dead-scope"]) == ("jobs.v2", "jobs")
    assert dead_letter_headers("attempts_limit", "jobs")["x-beetle-dead-scope"] == "jobs"


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_the_harness_store_claims_under_the_scope(h):
    facts = MessageFacts("jobs.v2", "m9", h.facts().expires_at_ms, scope="jobs")
    assert h.store.claim(facts, LIMITS, "w").acquired
    assert h.store.peek("jobs", "m9") is not None


def test_record_keys_gives_the_key_and_the_old_key_as_the_two_functions_do():
    import random

    from celery_beetle.store.keys import legacy_key, record_key, record_keys

    rng = random.Random(7)
    for _ in range(5_000):
        scope = "".join(rng.choice("ab:{}x") for _ in range(rng.randint(1, 6)))
        message_id = "".join(rng.choice("ab:{}x") for _ in range(rng.choice([1, 5, 201, 250])))
        expected = (record_key("p:", scope, message_id), legacy_key("p:", scope, message_id))
        assert record_keys("p:", scope, message_id) == expected
