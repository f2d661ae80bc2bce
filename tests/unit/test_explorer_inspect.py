"""What the fault explorer reads of the brokers at the end of a run.

A quorum queue's counts lag one tick behind it: a delivery the stopped workers held still
shows unacked, though the broker has it ready again.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from celery_beetle.testing.explorer import runner


class Node:
    """A broker whose ``explore`` queue reports ``depths`` in turn (the last one after)."""

    host_port = "127.0.0.1:5672"

    def __init__(self, depths: list[tuple[int, int]], ready: list[str]) -> None:
        self.depths = depths
        self.ready = ready

    def queue_depths(self, vhost: str) -> dict[str, tuple[int, int]]:
        depth = self.depths.pop(0) if len(self.depths) > 1 else self.depths[0]
        return {"explore": depth}

    def get_messages(self, vhost: str, queue: str) -> list[Any]:
        taken, self.ready = self.ready, []
        props = [SimpleNamespace(headers={"id": key}, message_id=key) for key in taken]
        return [(None, p, b"") for p in props]


def run_on(node: Node) -> Any:
    return SimpleNamespace(nodes=[node], destroyed=set(), vhost="v")


@pytest.fixture(autouse=True)
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)


def test_a_copy_counted_unacked_after_its_worker_stopped_is_left_ready_not_unacked() -> None:
    # the count is of the tick before the worker stopped: 0 ready, 1 unacked; the copy is ready
    node = Node([(0, 1), (0, 0)], ready=["s1-76"])
    _dead, left = runner._inspect(run_on(node))
    assert left == {"127.0.0.1:5672/explore": ["s1-76"]}


def test_a_delivery_a_live_connection_holds_is_left_unacked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner, "QUORUM_TICK_S", -1.0)  # no second look
    node = Node([(0, 1)], ready=[])
    _dead, left = runner._inspect(run_on(node))
    assert left == {"127.0.0.1:5672/explore": ["1 unacked"]}


def test_a_queue_counted_empty_is_drained_all_the_same() -> None:
    node = Node([(0, 0)], ready=["s1-9"])
    _dead, left = runner._inspect(run_on(node))
    assert left == {"127.0.0.1:5672/explore": ["s1-9"]}
