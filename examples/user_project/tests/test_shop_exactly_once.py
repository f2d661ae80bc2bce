"""The shop's tasks run exactly once when a broker or a worker dies mid-run.

Written with the beetle pytest plugin: ``beetle_setup`` gives RabbitMQ nodes behind one
``beetle://`` URL, a dedup Redis and a worker of ``beetle_shop.app``; the assertion reads the
test's trace and fails with the lost or duplicated ids.
"""

from __future__ import annotations

from beetle_shop.app import charge_card, send_receipt


def test_a_broker_killed_mid_run_loses_and_repeats_nothing(beetle_setup):
    for order in range(30):
        charge_card.delay(order)
        if order == 10:
            beetle_setup.broker_cluster[0].kill()  # kill -9, while publishing and consuming
    for order in range(10):
        send_receipt.delay(order)
    beetle_setup.assert_exactly_once(expected=40)


def test_a_worker_killed_mid_task_hands_the_charge_over_once(beetle_setup, beetle_worker_factory):
    charge_card.delay(1, seconds=3)
    send_receipt.delay(1)
    running = beetle_setup.worker.kill_mid_task()  # kill -9 while the charge runs
    assert running, "the charge was caught mid-run"
    beetle_worker_factory()  # another worker takes over once the dead run's lease expires
    beetle_setup.assert_exactly_once(expected=2, timeout=60)
