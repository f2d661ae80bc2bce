"""The pure rules of quorum queues and live migration: no server."""

from __future__ import annotations

import amqp
import pytest

from celery_beetle.ops.migrate import MigrationState, parse_arguments, target_arguments
from celery_beetle.worker.deadletter import dead_letter_headers, dead_letter_queue_name
from celery_beetle.worker.handback import HandBacks
from kombu_beetle.channel import inequivalent_arguments
from kombu_beetle.identity import PRODUCT, VERSION_PROPERTY, client_properties
from kombu_beetle.scopes import home_queue, migrating_queue, scope_of


class Delivery:
    def __init__(self, headers=None):  # type: ignore[no-untyped-def]
        self.headers = headers or {}


def test_the_temporary_queue_of_a_migration_shares_its_queues_scope_and_home():
    temp = migrating_queue("orders")
    assert temp == "orders.beetle-migrating"
    assert scope_of({}, temp) == "orders"
    assert scope_of({"orders": "shop"}, temp) == "shop"
    assert scope_of({temp: "other"}, temp) == "other", "an explicit mapping still wins"
    assert home_queue(temp) == "orders"
    assert home_queue(".beetle-migrating") == ".beetle-migrating"
    assert scope_of({}, "orders") == "orders"


def test_dead_letters_from_the_temporary_queue_go_to_and_name_the_home_queue():
    assert dead_letter_queue_name("orders.beetle-migrating") == "orders.dead"
    headers = dead_letter_headers("not_retryable", "orders.beetle-migrating")
    assert headers["x-beetle-dead-queue"] == "orders"
    assert headers["x-beetle-dead-scope"] == "orders"


def test_hand_backs_of_a_quorum_delivery_back_off_from_the_brokers_delivery_count():
    handbacks = HandBacks(lambda delay, fn: None, max_s=30.0)
    assert handbacks.delay_for("k", Delivery()) == 0.5
    # a worker that restarted knows nothing of this message; the broker counted 6 deliveries
    assert handbacks.delay_for("other", Delivery({"x-delivery-count": 6})) == 32.0
    assert handbacks.delay_for("late", Delivery({"x-delivery-count": 12})) == 300.0
    assert handbacks.delay_for(None, Delivery({"x-delivery-count": 1})) == 1.0
    assert handbacks.delay_for(None, Delivery()) == 1.0
    classic = HandBacks(lambda delay, fn: None, max_s=30.0)
    assert [classic.delay_for("k") for _ in range(8)][-1] == 30.0


def test_migration_arguments_keep_the_current_ones_and_refuse_what_quorum_refuses():
    assert parse_arguments(["x-max-length=10", "x-queue-mode=", "x-overflow=drop-head"]) == {
        "x-max-length": 10,
        "x-queue-mode": None,
        "x-overflow": "drop-head",
    }
    with pytest.raises(ValueError, match="x-NAME=VALUE"):
        parse_arguments(["max-length=10"])
    current = {"x-message-ttl": 5000, "x-queue-mode": "lazy"}
    assert target_arguments(current, "quorum", {"x-queue-mode": None}) == {
        "x-message-ttl": 5000,
        "x-queue-type": "quorum",
    }
    assert target_arguments({"x-queue-type": "quorum"}, "classic", {}) == {}
    with pytest.raises(ValueError, match="--arg x-max-priority="):
        target_arguments({"x-max-priority": 9}, "quorum", {})


def test_a_migration_state_survives_its_json_and_says_where_it_stands():
    state = MigrationState("orders", "/", {"x-queue-type": "quorum"}, ["r1:5672", "r2:5672"])
    state.steps["r1:5672"] = "moved-back"
    again = MigrationState.from_json(state.to_json())
    assert again == state
    text = again.describe()
    assert "r1:5672: moved-back" in text and "r2:5672: pending" in text


def test_the_transport_names_itself_in_its_client_properties():
    props = client_properties({"connection_name": "mine", "product": "theirs"})
    assert props["product"] == PRODUCT
    assert props[VERSION_PROPERTY] == props["version"]
    assert props["connection_name"] == "mine"


def test_only_an_inequivalent_argument_counts_as_a_migrated_queue():
    refused = amqp.PreconditionFailed(
        "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost '/'"
    )
    assert inequivalent_arguments(refused)
    assert not inequivalent_arguments(amqp.PreconditionFailed("unknown delivery tag 1"))
    assert not inequivalent_arguments(amqp.NotFound("no queue 'q'"))
