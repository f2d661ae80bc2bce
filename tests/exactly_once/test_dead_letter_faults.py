"""A dead letter that cannot be stored: the message is handed back, never acked without it.

``<queue>.dead`` declared beforehand as a queue that holds nothing and refuses what comes
(``x-max-length: 0``, ``x-overflow: reject-publish``): every broker nacks a dead letter, so
none can be stored. (The transport consumes and publishes to a queue declared with other
arguments as it is, so a mismatched declaration alone no longer blocks it.) The message must stay
on its broker until the dead-letter queue works again, and then be dead-lettered once.
"""

from __future__ import annotations

import json

from celery_beetle.testing.waiting import wait_until
from tests.exactly_once.conftest import counts
from tests.exactly_once.poison import (
    celery_queue_empty,
    publish_raw,
    stored_dead_letters,
    take_dead_letters,
    worker_restarted,
)

NO_GRACE = {"BEETLE_TEST_CONF": json.dumps({"beetle_unknown_task_grace": 0})}


def _block_dead_letters(brokers) -> None:
    for node in brokers.nodes:
        with node.connect(brokers.vhost) as connection:
            connection.channel().queue_declare(
                "celery.dead",
                durable=True,
                arguments={"x-max-length": 0, "x-overflow": "reject-publish"},
            )


def _unblock_dead_letters(brokers) -> None:
    for node in brokers.nodes:
        with node.connect(brokers.vhost) as connection:
            connection.channel().queue_delete("celery.dead")


def _dead_letter_lines(worker) -> str:
    """What the worker said about dead letters: a failure shows its tries and their times."""
    return "\n".join(line[:240] for line in worker.log_text().splitlines() if "dead-letter" in line)


def _held(brokers) -> int:
    return sum(sum(depths.get("celery", (0, 0))) for depths in brokers.queue_depths())


def test_bad_input_whose_dead_letter_fails_stays_queued_until_it_is_stored_once(brokers, eo_worker):
    _block_dead_letters(brokers)
    worker = eo_worker(extra_env=NO_GRACE)
    task_id = publish_raw(
        brokers.nodes[0], brokers.vhost, body=b"{not json", message_id="garbled-1"
    )
    assert wait_until(lambda: "could not dead-letter" in worker.log_text(), timeout=15)
    assert _held(brokers) == 1, "handed back, not acked"
    _unblock_dead_letters(brokers)
    # the property is "stored once", not how soon: the copy's hand-backs back off to 30 s
    # while the dead letter is refused, so its next try may come 30 s after the unblock
    assert wait_until(lambda: stored_dead_letters(brokers) == 1, timeout=75), _dead_letter_lines(
        worker
    )
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=15)
    dead = take_dead_letters(brokers)
    assert [h["x-beetle-dead-reason"] for h in dead[task_id]] == ["undecodable"]
    assert worker.alive() and worker_restarted(worker.log_text()) == []


def test_a_give_up_whose_dead_letter_fails_is_dead_lettered_once_it_can_be(
    brokers, client, eo_worker
):
    _block_dead_letters(brokers)
    worker = eo_worker()
    result = client().tasks["eo.picky"].delay(501)  # not worth a retry: dead-letters at once
    assert wait_until(lambda: "could not dead-letter" in worker.log_text(), timeout=15)
    assert _held(brokers) >= 1, "handed back, not acked"
    _unblock_dead_letters(brokers)
    # the run that gave up owns the dead letter for 30 s; then a copy's worker publishes it
    assert wait_until(lambda: stored_dead_letters(brokers) == 1, timeout=50)
    assert wait_until(lambda: celery_queue_empty(brokers), timeout=15)
    dead = take_dead_letters(brokers)
    assert [h["x-beetle-dead-reason"] for h in dead[result.id]] == ["not_retryable"]
    assert counts([worker], "start") == {501: 1}, "the body ran once"
    assert worker.alive()
