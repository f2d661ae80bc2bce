"""The relay declares a row's queues as Celery's producer would, once a minute per queue,
and a run of rows for the same queues costs a comparison, not a declaration each."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest

from celery_beetle.outbox import relay as relay_module
from celery_beetle.outbox.relay import DECLARE_TTL_S, Relay

SPEC = {
    "name": "work",
    "exchange": "work",
    "exchange_type": "direct",
    "routing_key": "work",
    "durable": True,
    "auto_delete": False,
    "queue_arguments": None,
}


def _row(declare: Any, exchange: str = "work") -> dict[str, Any]:
    return {"declare": declare, "exchange": exchange}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(relay_module.time, "monotonic", lambda: now[0])
    return now


def _relay() -> Relay:
    return Relay(mock.MagicMock(), mock.MagicMock(), tracer=mock.MagicMock())


def test_a_run_of_rows_for_one_queue_is_declared_once_until_the_minute_is_over(clock):
    relay = _relay()
    for _ in range(3):
        relay._declare(_row([dict(SPEC)]))
    assert relay.channel.queue_declare.call_count == 1
    clock[0] += DECLARE_TTL_S + 1
    relay._declare(_row([dict(SPEC)]))
    assert relay.channel.queue_declare.call_count == 2


def test_a_row_for_another_queue_between_two_of_one_declares_only_the_new_one(clock):
    relay = _relay()
    other = {**SPEC, "name": "other", "routing_key": "other"}
    relay._declare(_row([SPEC]))
    relay._declare(_row([other]))
    relay._declare(_row([SPEC]))
    names = [c.kwargs.get("queue") or c.args[0] for c in relay.channel.queue_declare.call_args_list]
    assert names == ["work", "other"]


def test_a_row_without_queues_has_its_exchange_checked_once_a_minute(clock):
    relay = _relay()
    relay._declare(_row(None, "events"))
    relay._declare(_row(None, "events"))
    relay.channel.exchange_declare.assert_called_once_with("events", passive=True)
    clock[0] += DECLARE_TTL_S + 1
    relay._declare(_row(None, "events"))
    assert relay.channel.exchange_declare.call_count == 2
