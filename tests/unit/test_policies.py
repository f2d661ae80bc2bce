"""Queue properties and policy plans, without a broker (:mod:`celery_beetle.ops.policies`)."""

from __future__ import annotations

import pytest

from celery_beetle.ops.management import ManagementConfig
from celery_beetle.ops.policies import (
    PolicyConfig,
    QueueProperties,
    desired_policy,
    plan_broker,
)
from kombu_beetle.options import BrokerAddress


def test_a_queues_policy_routes_dead_letters_to_its_own_dead_queue_through_the_default_exchange():
    config = PolicyConfig.from_mapping(
        {"default": {"message_ttl_ms": 1000}, "queues": {"a.b": {"max_length": 5}}}
    )
    assert desired_policy("a.b", config) == {
        "pattern": r"^a\.b$",
        "definition": {
            "dead-letter-exchange": "",
            "dead-letter-routing-key": "a.b.dead",
            "message-ttl": 1000,
            "max-length": 5,
        },
        "priority": 10,
        "apply-to": "queues",
    }


def test_a_queues_own_property_overrides_the_default():
    config = PolicyConfig.from_mapping(
        {"default": {"message_ttl_ms": 1000}, "queues": {"q": {"message_ttl_ms": 7}}}
    )
    assert config.properties("q").message_ttl_ms == 7
    assert config.properties("other").message_ttl_ms == 1000


@pytest.mark.parametrize("name", ["queue_type", "x-max-priority", "max_priority"])
def test_properties_a_policy_cannot_set_are_refused_with_a_pointer_to_migration(name):
    with pytest.raises(ValueError, match="migration"):
        QueueProperties.from_mapping({name: "quorum"})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"ttl": 5}, "unknown queue property 'ttl'"),
        ({"overflow": "explode"}, "overflow='explode'"),
        ({"max_length": -1}, "whole number"),
        ({"queue_version": 3}, "1 or 2"),
    ],
)
def test_bad_properties_say_what_is_wrong(values, message):
    with pytest.raises(ValueError, match=message):
        QueueProperties.from_mapping(values)


def test_plan_creates_what_is_missing_and_nothing_when_the_broker_matches():
    config = PolicyConfig.from_mapping({"default": {"max_length": 3}})
    changes, drift = plan_broker("b1", ["q"], config, [], [{"name": "q", "arguments": {}}])
    assert [(c.kind, c.name) for c in changes] == [("create", "beetle.q"), ("declare", "q.dead")]
    assert drift == []
    policies = [{"name": "beetle.q", "vhost": "/", **desired_policy("q", config)}]
    queues = [{"name": "q", "arguments": {}}, {"name": "q.dead", "arguments": {}}]
    assert plan_broker("b1", ["q"], config, policies, queues) == ([], [])


def test_plan_names_x_arguments_and_other_policies_that_beat_ours():
    config = PolicyConfig.from_mapping({"default": {"message_ttl_ms": 10}})
    policies = [{"name": "low", "pattern": ".*", "priority": 0, "definition": {}}]
    policies.append({"name": "high", "pattern": "^q", "priority": 50, "definition": {}})
    queues = [{"name": "q", "arguments": {"x-message-ttl": 99}, "policy": "high"}]
    _, drift = plan_broker("b1", ["q"], config, policies, queues)
    text = [d.message for d in drift]
    assert any("x-message-ttl=99" in t for t in text)
    assert any("'high' applies, not ours" in t for t in text)
    assert any("'high' (priority 50)" in t and "shadows" in t for t in text)
    assert not any("'low'" in t for t in text)


def test_the_management_api_defaults_to_the_brokers_host_on_15672_and_urls_override_it():
    config = ManagementConfig(urls={"r2:5672": "https://r2.example:15671/"})
    assert config.base_url(BrokerAddress("r1", 5672)) == "http://r1:15672"
    assert config.base_url(BrokerAddress("r2", 5672)) == "https://r2.example:15671"
    assert "secret" not in repr(ManagementConfig(password="secret"))


def test_an_unreachable_fleet_lock_skips_the_round_instead_of_failing():
    import redis

    from celery_beetle.ops.applier import FleetLock

    class Down:
        def set(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise redis.ConnectionError("refused")

    assert FleetLock(Down(), "k", 1000).acquire("w1") is False


def test_plan_says_what_rabbitmq_4s_delivery_limit_does_to_a_quorum_queue_left_to_the_broker():
    config = PolicyConfig.from_mapping({})
    quorum = [{"name": "q", "type": "quorum", "arguments": {"x-queue-type": "quorum"}}]
    _, drift = plan_broker("b1", ["q"], config, [], quorum)
    (note,) = [d.message for d in drift]
    assert "RabbitMQ 4: 20" in note and "q.dead" in note and "consumer_timeout" in note
    limited = PolicyConfig.from_mapping({"default": {"delivery_limit": 50}})
    assert plan_broker("b1", ["q"], limited, [], quorum)[1] == []
    classic = [{"name": "q", "type": "classic", "arguments": {}}]
    assert plan_broker("b1", ["q"], config, [], classic)[1] == []
