"""Celery's canvas with every task a BeetleTask, beside the same canvas on plain Celery.

Each test runs twice: ``beetle`` (``task_cls`` BeetleTask, ``celery_beetle.install``, two
brokers, Celery's built-in canvas tasks gated too) and ``plain`` (plain Celery tasks on one
broker through ``pyamqp://``). The same assertions hold on both: the canvas's results, and
each body run once (issue #26: chains, groups, chords, link/link_error, chunks, map,
starmap, a countdown inside a chain, ``ignore_result``, a replacement inside a chain).
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from celery import chain, chord, group
from celery.exceptions import TaskRevokedError

from celery_beetle.testing.waiting import wait_until

pytestmark = pytest.mark.integration

RESULT_TIMEOUT_S = 45


def _settled(semantics, expected: Counter[str]) -> None:
    """Every body in ``expected`` ran as often as said, and no more a moment later."""
    assert wait_until(lambda: semantics.runs() == expected, timeout=20), semantics.runs()
    time.sleep(1)
    assert semantics.runs() == expected


def test_a_chain_passes_each_result_on_and_runs_each_link_once(semantics):
    t = semantics.app.tasks
    result = chain(t["sem.add"].s(1, 1), t["sem.add"].s(2), t["sem.add"].s(3)).delay()
    assert result.get(timeout=RESULT_TIMEOUT_S) == 7
    assert result.parent.get(timeout=RESULT_TIMEOUT_S) == 4
    _settled(semantics, Counter({"add": 3}))


def test_a_group_returns_every_result_in_order(semantics):
    t = semantics.app.tasks
    result = group(t["sem.add"].s(i, i) for i in range(10)).delay()
    assert result.get(timeout=RESULT_TIMEOUT_S) == [2 * i for i in range(10)]
    _settled(semantics, Counter({"add": 10}))


def test_a_chords_body_runs_once_with_every_header_result(semantics):
    t = semantics.app.tasks
    result = chord(t["sem.add"].s(i, i) for i in range(10))(t["sem.tsum"].s())
    assert result.get(timeout=RESULT_TIMEOUT_S) == 90
    _settled(semantics, Counter({"add": 10, "tsum": 1}))


def test_a_chain_through_a_group_into_a_chord_body(semantics):
    t = semantics.app.tasks
    canvas = chain(
        t["sem.add"].s(1, 1), group(t["sem.add"].s(1), t["sem.add"].s(2)), t["sem.tsum"].s()
    )
    assert canvas.delay().get(timeout=RESULT_TIMEOUT_S) == 7
    _settled(semantics, Counter({"add": 3, "tsum": 1}))


def test_link_and_link_error_callbacks_run_once(semantics):
    t = semantics.app.tasks
    ok = t["sem.add"].apply_async((2, 2), link=t["sem.note"].s())
    assert ok.get(timeout=RESULT_TIMEOUT_S) == 4
    failed = t["sem.fail"].apply_async((7,), link_error=t["sem.on_error"].s())
    with pytest.raises(ValueError):
        failed.get(timeout=RESULT_TIMEOUT_S)
    _settled(semantics, Counter({"add": 1, "note": 1, "fail": 1, "on_error": 1}))


def test_chunks_map_and_starmap(semantics):
    t = semantics.app.tasks
    chunks = t["sem.add"].chunks([(i, i) for i in range(6)], 2).delay()
    assert chunks.get(timeout=RESULT_TIMEOUT_S) == [[0, 2], [4, 6], [8, 10]]
    assert t["sem.tsum"].map([[1, 2], [3, 4]]).delay().get(timeout=RESULT_TIMEOUT_S) == [3, 7]
    starmap = t["sem.add"].starmap([(1, 2), (3, 4)]).delay()
    assert starmap.get(timeout=RESULT_TIMEOUT_S) == [3, 7]
    _settled(semantics, Counter({"add": 8, "tsum": 2}))


def test_a_countdown_inside_a_chain_is_kept(semantics):
    t = semantics.app.tasks
    started = time.monotonic()
    canvas = chain(t["sem.add"].si(1, 2), t["sem.add"].s(3).set(countdown=2))
    assert canvas.delay().get(timeout=RESULT_TIMEOUT_S) == 6
    assert time.monotonic() - started >= 2
    _settled(semantics, Counter({"add": 2}))


def test_a_task_that_ignores_its_result_runs_once_and_stores_none(semantics):
    result = semantics.app.tasks["sem.quiet"].delay(5)
    _settled(semantics, Counter({"quiet": 1}))
    assert result.state == "PENDING"  # nothing stored, as Celery does


def test_a_replacement_inside_a_chain_hands_its_result_on(semantics):
    t = semantics.app.tasks
    canvas = chain(t["sem.replaced_by_add"].si(1, 2), t["sem.add"].s(10))
    assert canvas.delay().get(timeout=RESULT_TIMEOUT_S) == 13
    _settled(semantics, Counter({"replaced_by_add": 1, "add": 2}))


def test_tasks_revoked_by_a_stamped_header_never_run_anywhere_in_a_canvas(semantics):
    t = semantics.app.tasks
    replies = semantics.app.control.revoke_by_stamped_headers(
        {"revoke_key": "batch-7"}, reply=True, timeout=5
    )
    assert replies, "no worker answered the revoke"
    members = group(t["sem.add"].si(1, 1), t["sem.add"].si(2, 2))
    members.stamp(revoke_key="batch-7")
    revoked = members.delay()
    links = chain(
        t["sem.add"].si(3, 3),
        chord([t["sem.add"].si(4, 4), t["sem.add"].si(5, 5)], t["sem.tsum"].s()),
    )
    links.stamp(revoke_key="batch-7")
    head = links.delay()
    while head.parent is not None:
        head = head.parent
    for result in [*revoked.results, head]:
        with pytest.raises(TaskRevokedError):
            result.get(timeout=RESULT_TIMEOUT_S)
    # an unstamped task runs; nothing stamped ran, and nothing was stored twice
    assert t["sem.note"].delay("after").get(timeout=RESULT_TIMEOUT_S) == "after"
    _settled(semantics, Counter({"note": 1}))
