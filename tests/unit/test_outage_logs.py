"""An expected condition is said twice, at WARNING: as it begins and, with counts, as it ends."""

from __future__ import annotations

import logging
import re
import sys

from celery.exceptions import Reject
from redis.exceptions import ConnectionError as RedisConnectionError

from celery_beetle.store.health import call_until_stored
from celery_beetle.worker.errors import CELERY_TRACE_LOGGER, Deferred, HandBack
from tests.unit.test_gate import Harness, Message


def _warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("celery_beetle")
    ]


def test_an_outage_is_one_warning_naming_the_store_and_one_with_counts_as_it_ends(caplog):
    h = Harness()
    h.rebuild(store_name="redis://:**@store:6379/0")
    h.store.down = True
    h.redis_answers = False
    with caplog.at_level(logging.DEBUG):
        for message_id in ("m1", "m2", "m3"):
            assert h.deliver(Message(message_id)) == "parked"
        h.timer.advance(5)  # five probes that fail
        h.store.down = False
        h.redis_answers = True
        h.timer.advance(1)
    began, ended = _warnings(caplog)
    assert began.startswith("beetle: dedup store redis://:**@store:6379/0 is unreachable (")
    assert "parking deliveries" in began
    assert re.fullmatch(
        r"beetle: dedup store redis://:\*\*@store:6379/0 answers again after \d+\.\d s: "
        r"3 deliveries parked, 0 handed back, 0 completion retries",
        ended,
    ), ended
    assert len(h.started) == 3


def test_a_store_away_as_the_worker_starts_pauses_the_gate_before_any_delivery(caplog):
    h = Harness()
    h.redis_answers = False
    with caplog.at_level(logging.WARNING):
        assert h.gate.pause_if_unreachable()
        assert not h.gate.pause_if_unreachable(), "said once"
    assert len(_warnings(caplog)) == 1 and h.gate.paused
    assert h.deliver(Message("m1")) == "parked"
    h.redis_answers = True
    h.timer.advance(1)
    assert not h.gate.paused and len(h.started) == 1


def test_a_store_that_answers_as_the_worker_starts_says_nothing(caplog):
    h = Harness()
    with caplog.at_level(logging.DEBUG):
        assert not h.gate.pause_if_unreachable()
    assert _warnings(caplog) == [] and not h.gate.paused


def _celery_logs(exc: BaseException) -> None:
    """What Celery's tracer does with a run's Reject: a WARNING with its traceback."""
    try:
        raise exc
    except BaseException:
        logging.getLogger(CELERY_TRACE_LOGGER).warning("Task t[1] %r", exc, exc_info=sys.exc_info())


def test_celery_s_line_for_a_hand_back_or_a_deferral_is_moved_to_debug(caplog):
    with caplog.at_level(logging.DEBUG):
        _celery_logs(HandBack("start not stored: network:ConnectionError", 2.0, True))
        _celery_logs(Deferred("locked for 60000 ms"))
        _celery_logs(Reject("a body's own reject", requeue=True))
    seen = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert [s for s in seen if s[1] == "WARNING"] == [
        (CELERY_TRACE_LOGGER, "WARNING", "Task t[1] reject requeue=True: a body's own reject")
    ]
    assert [s[1] for s in seen if "locked for" in s[2] or "not stored" in s[2]] == [
        "DEBUG",
        "DEBUG",
    ]


def test_waiting_to_store_a_completion_is_said_as_it_begins_and_as_it_ends(caplog):
    def operation(number: int) -> str:
        if number < 5:
            raise RedisConnectionError("connection refused")
        return "stored"

    with caplog.at_level(logging.DEBUG):
        assert call_until_stored(operation, "the completion of t", sleep=lambda _: None)
    began, ended = _warnings(caplog)
    assert began.startswith("beetle: cannot store the completion of t yet (")
    assert re.fullmatch(r"beetle: stored the completion of t after \d+\.\d s and 6 tries", ended)
