"""Celery events tell the truth: a copy dropped at the pool's claim is not a run."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

from celery.exceptions import Ignore
from celery.worker.request import Request

from celery_beetle.task import DROPPED_EVENT, BeetleRequest
from celery_beetle.worker.errors import Dropped


def test_a_dropped_copy_is_ignored_by_celery_and_keeps_its_reason_across_the_pool():
    dropped = pickle.loads(pickle.dumps(Dropped("duplicate")))
    assert isinstance(dropped, Ignore)
    assert dropped.reason == "duplicate"


def test_a_copy_dropped_at_the_pools_claim_sends_task_beetle_dropped(monkeypatch):
    monkeypatch.setattr(Request, "on_failure", lambda self, *args, **kwargs: None)
    request = BeetleRequest.__new__(BeetleRequest)
    sent: list[tuple[str, dict[str, str]]] = []
    request.send_event = lambda type_, **fields: sent.append((type_, fields))  # type: ignore[method-assign]
    request.on_failure(SimpleNamespace(exception=Dropped("expired")))
    assert sent == [(DROPPED_EVENT, {"reason": "expired"})]
    assert DROPPED_EVENT == "task-beetle-dropped"


def test_other_failures_send_no_dropped_event(monkeypatch):
    monkeypatch.setattr(Request, "on_failure", lambda self, *args, **kwargs: None)
    request = BeetleRequest.__new__(BeetleRequest)
    sent: list[str] = []
    request.send_event = lambda type_, **fields: sent.append(type_)  # type: ignore[method-assign]
    request.on_failure(SimpleNamespace(exception=RuntimeError("boom")))
    assert sent == []
