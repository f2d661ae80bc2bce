"""A migration's broadcasts stop waiting once the workers it knows have answered."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from celery_beetle.ops.migration_control import CeleryControl


class _Recorder:
    """Stands in for ``app.control.broadcast``: records the reply limit, answers as told."""

    def __init__(self, answers: list[list[dict[str, Any]]]) -> None:
        self.answers = answers
        self.limits: list[int | None] = []

    def __call__(self, command: str, **kwargs: Any) -> list[dict[str, Any]]:
        self.limits.append(kwargs.get("limit"))
        return self.answers.pop(0)


@pytest.fixture
def control() -> Iterator[CeleryControl]:
    c = CeleryControl("amqp://guest:guest@127.0.0.1:5672//")
    yield c
    c.close()


def test_the_first_broadcast_waits_for_everyone_and_later_ones_for_the_workers_known(
    control: CeleryControl, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = _Recorder(
        [
            [{"w1@h": {"ok": "1"}}, {"w2@h": {"ok": "1"}}],
            [{"w2@h": {"ok": "handed back"}}, {"w1@h": {"ok": "handed back"}}],
            [{"w1@h": {"ok": "consuming"}}],
        ]
    )
    monkeypatch.setattr(control.app.control, "broadcast", recorder)
    assert control.add_consumer("orders.migrating") == ["w1@h", "w2@h"]
    assert control.hand_back("orders", 0) == ["w1@h", "w2@h"]
    assert control.consume("orders") == ["w1@h"]
    assert recorder.limits == [None, 2, 2]


def test_a_worker_answering_with_an_error_is_not_counted_as_known(
    control: CeleryControl, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = _Recorder(
        [
            [{"w1@h": {"ok": "1"}}, {"old@h": {"error": "unknown command"}}],
            [{"w1@h": {"ok": "handed back"}}],
        ]
    )
    monkeypatch.setattr(control.app.control, "broadcast", recorder)
    assert control.hand_back("orders", 0) == ["w1@h"]
    assert control.hand_back("orders", 0) == ["w1@h"]
    assert recorder.limits == [None, 1]
