"""The gated strategy: what Celery's ack and reject do to a delivery the gate started."""

from __future__ import annotations

import gc
import weakref
from typing import Any

from celery_beetle.worker.facts import COMPLETED_MARK, FACTS_HEADER, HANDBACK_MARK
from celery_beetle.worker.strategy import GatedStrategy
from tests.unit.test_gate import Harness, Message
from tests.unit.test_gate_claims import Harness as ClaimsHarness


class Strategy:
    """Celery's strategy, faked: it keeps the ack and reject a request would get."""

    def __init__(self) -> None:
        self.started: list[tuple[Any, Any, Any]] = []

    def __call__(self, message: Any, body: Any, on_ack: Any, on_reject: Any, *args: Any) -> None:
        self.started.append((message, on_ack, on_reject))


def _gated(h: Harness) -> tuple[GatedStrategy, Strategy]:
    strategy = Strategy()
    return GatedStrategy(strategy, "t.beetle", h.gate, consumer=object()), strategy


def _deliver(gated: GatedStrategy, message: Message, acked: list[str]) -> None:
    gated(message, None, lambda: acked.append("ack"), lambda **kw: acked.append("reject"), None)


def test_an_ack_after_a_completion_drops_the_waiting_twin_as_a_duplicate():
    h = Harness()
    gated, strategy = _gated(h)
    acked: list[str] = []
    first, twin = Message(broker="rabbit-a"), Message(broker="rabbit-b")
    _deliver(gated, first, acked)
    _deliver(gated, twin, acked)
    assert len(strategy.started) == 1, "the twin waits in the gate, not in Celery"
    message, on_ack, _ = strategy.started[0]
    message.headers[FACTS_HEADER][COMPLETED_MARK] = True
    on_ack()
    assert acked == ["ack"] and twin.acks == 1


def test_a_reject_the_pool_handed_back_is_made_after_a_backoff():
    h = Harness()
    gated, strategy = _gated(h)
    acked: list[str] = []
    _deliver(gated, Message(), acked)
    message, _, on_reject = strategy.started[0]
    message.headers[FACTS_HEADER][HANDBACK_MARK] = {"delay_s": 2.0}
    on_reject(requeue=True)
    assert acked == [], "not at once: a poison message would spin"
    h.timer.advance(2.0)
    assert acked == ["reject"]


def test_a_completion_the_store_has_no_record_for_requeues_through_celerys_reject():
    h = ClaimsHarness()
    gated, strategy = _gated(h)  # type: ignore[arg-type]
    done: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    message = Message()
    gated(
        message,
        None,
        lambda *args, **kw: done.append(("ack", args, kw)),
        lambda *args, **kw: done.append(("reject", args, kw)),
        None,
    )
    h.calls.flush()
    started, on_ack, _ = strategy.started[0]
    started.headers[FACTS_HEADER][COMPLETED_MARK] = True
    on_ack("logger", "errors")  # as Celery's Request.acknowledge calls it
    h.store.records.clear()  # a Redis failover lost the claim
    h.calls.flush()
    assert done == [("reject", ("logger", "errors"), {"requeue": True})]


def test_deliveries_that_went_through_the_strategy_are_freed_without_the_cyclic_collector():
    h = Harness()
    gated, strategy = _gated(h)
    gc.disable()
    try:
        refs = []
        for n in range(3):
            first, twin = Message(message_id=f"m{n}"), Message(message_id=f"m{n}")
            refs += [weakref.ref(first), weakref.ref(twin)]
            _deliver(gated, first, [])
            _deliver(gated, twin, [])
            message, on_ack, on_reject = strategy.started.pop()
            message.headers[FACTS_HEADER][COMPLETED_MARK] = True
            on_ack()
            del first, twin, message, on_ack, on_reject
        assert [r for r in refs if r() is not None] == [], "a reference cycle keeps them"
    finally:
        gc.enable()


def _routing_seen_by_celery(exchange: str, routing_key: str) -> tuple[str, str]:
    """The exchange and routing key Celery's strategy sees for a delivery that came with
    ``exchange`` and ``routing_key`` (the harness's queue is the routing key)."""
    gated, strategy = _gated(Harness())
    message = Message()
    message.delivery_info.update(exchange=exchange, routing_key=routing_key)
    _deliver(gated, message, [])
    started, _, _ = strategy.started[0]
    return started.delivery_info["exchange"], started.delivery_info["routing_key"]


def test_a_delivery_from_a_migrations_temporary_queue_reaches_celery_routed_to_its_home_queue():
    # Celery's retry is sent where the delivery came from: the home queue, which stays
    assert _routing_seen_by_celery("", "jobs.beetle-migrating") == ("", "jobs")


def test_a_delivery_from_its_own_queue_keeps_its_routing():
    assert _routing_seen_by_celery("jobs", "jobs") == ("jobs", "jobs")
