"""Fault injection against real brokers, workers and Redis, judged by the audit.

Every scenario publishes BeetleTask messages (two copies each) while prefork workers
consume them, injects one fault halfway, heals it, waits until every confirmed message ran,
and asks ``beetle audit`` for the verdict: 0 lost, 0 duplicated, 0 unexpected.
"""

from __future__ import annotations

import time

import pika

from celery_beetle.testing.rabbit import beetle_url
from celery_beetle.testing.redis_faults import refusing_writes
from celery_beetle.testing.waiting import wait_until
from tests.chaos.conftest import judge
from tests.exactly_once.poison import (
    MUST_DEAD_LETTER,
    dead_letter_count,
    publish_poison,
    take_dead_letters,
)


def test_kill_9_of_a_broker_while_publishing_and_consuming(chaos, brokers, spark, messages):
    run = chaos("broker kill -9, then restart")
    run.begin(messages)
    brokers.nodes[0].kill()
    run.wait_published(2 * messages // 3)
    brokers.nodes[0].restart()
    assert run.wait_all_done() == set()
    judge(run, spark)


def test_a_broker_frozen_longer_than_the_confirm_timeout(chaos, brokers, spark, messages):
    run = chaos("broker SIGSTOP 3 s")
    run.begin(messages)
    brokers.nodes[1].pause()
    time.sleep(3)  # three confirm timeouts
    brokers.nodes[1].resume()
    assert run.wait_all_done() == set()
    judge(run, spark)


def test_kill_9_of_a_worker_mid_task(chaos, brokers, spark, messages):
    run = chaos("worker kill -9 mid-task")
    victim, _ = run.begin(messages, sleep_s=0.05)
    victim.kill()
    run.start_worker()  # a replacement, as a supervisor would start
    assert run.wait_all_done(timeout=180) == set()
    judge(run, spark)


def test_redis_killed_and_restarted_with_aof(chaos, brokers, spark, messages, redis_aof):
    run = chaos("redis kill -9, restart (AOF)", redis=redis_aof.url)
    run.begin(messages)
    redis_aof.kill()
    time.sleep(2)
    redis_aof.restart()
    assert run.wait_all_done(timeout=180) == set()
    judge(run, spark)


def test_a_brokers_traffic_cut_by_the_proxy(chaos, brokers, spark, messages, tcp_proxy):
    proxy = tcp_proxy(brokers.nodes[2])
    url = beetle_url(
        [brokers.nodes[0].host_port, brokers.nodes[1].host_port, proxy.host_port], brokers.vhost
    )
    run = chaos("broker traffic cut (proxy)")
    run.begin(messages, url=url)
    proxy.cut()
    time.sleep(3)
    proxy.restore()
    assert run.wait_all_done() == set()
    judge(run, spark)


def test_malformed_and_oversized_messages_mixed_into_the_stream(chaos, brokers, spark, messages):
    run = chaos("malformed + oversized messages")
    worker, _ = run.begin(messages)
    node = brokers.nodes[0]
    with node.connect(brokers.vhost) as conn:
        channel = conn.channel()
        bad = [
            (b"not json at all", pika.BasicProperties(content_type="application/json")),
            (b'{"half": ', pika.BasicProperties(content_type="application/json",
                                                headers={"task": "eo.record", "id": "x1"})),
            (b"[[1], {}, {}]", pika.BasicProperties(content_type="application/json",
                                                    headers={"task": "no.such.task", "id": "x2"},
                                                    message_id="x2")),
            (b"[[1], {}, {}]", pika.BasicProperties(content_type="application/json",
                                                    headers={"task": "eo.record", "id": "x3",
                                                             "x-beetle-flags": 1})),
            (b"\x00" * (4 * 1024 * 1024), pika.BasicProperties(content_type="application/x-bad")),
        ]  # fmt: skip
        for body, props in bad:
            channel.basic_publish("", "celery", body, props)
    assert run.wait_all_done() == set()
    assert worker.alive()
    judge(run, spark)


def test_two_of_three_brokers_down_messages_still_flow(chaos, brokers, spark, messages):
    run = chaos("2 of 3 brokers down")
    run.begin(messages)
    brokers.nodes[0].kill()
    brokers.nodes[1].kill()
    before = len(run.done_lines())
    run.wait_published(2 * messages // 3)
    time.sleep(1)
    assert len(run.done_lines()) > before  # consumed from the one broker left
    brokers.nodes[0].restart()
    brokers.nodes[1].restart()
    assert run.wait_all_done() == set()
    judge(run, spark)


def test_poison_headers_mixed_in_while_the_dedup_redis_refuses_writes(
    chaos, brokers, spark, messages, redis_own
):
    run = chaos("poison + redis refusing writes 3 s", redis=redis_own.url)
    run.begin(messages)
    pids = [worker.pid for worker in run.workers]
    node, vhost = brokers.nodes[0], brokers.vhost
    half = len(MUST_DEAD_LETTER) // 2
    poison = list(enumerate(MUST_DEAD_LETTER, start=100_000))
    sent = [publish_poison(node, vhost, p, item) for item, p in poison[:half]]
    with refusing_writes(redis_own):  # the rest go in while Redis refuses writes
        sent += [publish_poison(node, vhost, p, item) for item, p in poison[half:]]
        time.sleep(3)

    def why() -> str:
        crashes = [line for w in run.workers for line in w.log_text().splitlines()
                   if "Unrecoverable error" in line]  # fmt: skip
        return f"alive {[w.alive() for w in run.workers]}: {crashes}"

    missing = run.wait_all_done(timeout=40)
    assert missing == set(), f"{len(missing)} never ran; workers {why()}"
    assert wait_until(lambda: dead_letter_count(brokers) >= len(sent), timeout=15), why()
    assert all(w.alive() for w in run.workers)
    assert [worker.pid for worker in run.workers] == pids
    judge(run, spark)
    dead = take_dead_letters(brokers)
    assert {task_id: len(dead.get(task_id, [])) for task_id in sent} == dict.fromkeys(sent, 1)
