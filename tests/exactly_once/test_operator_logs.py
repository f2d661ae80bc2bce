"""What a worker's log says about an expected condition: one line as it starts, one as it ends.

A broker lost and back, a dedup store unreachable at start or during work: an operator reads
each as a pair of lines with counts, at WARNING, and no traceback.
"""

from __future__ import annotations

import re
import time

from tests.exactly_once.conftest import counts
from tests.harness.rabbit import beetle_url
from tests.harness.waiting import wait_until


def _lines(log: str, pattern: str) -> list[str]:
    return [line for line in log.splitlines() if re.search(pattern, line)]


def test_a_broker_lost_and_back_is_said_once_each_way_whatever_connections_notice(
    brokers, client, eo_worker, tcp_proxy
):
    proxy = tcp_proxy(brokers.nodes[0])
    url = beetle_url([proxy.host_port, brokers.nodes[1].host_port], brokers.vhost)
    worker = eo_worker(url=url)
    app = client(url=url)
    app.tasks["eo.record"].delay(0)
    assert wait_until(lambda: counts([worker])[0] == 1, timeout=20)
    proxy.cut()
    # the producer's connection notices too: a retry is published while the broker is away
    app.tasks["eo.flaky"].delay(1)
    assert wait_until(lambda: counts([worker], "start")[1] >= 1, timeout=20)
    time.sleep(2)  # both connections have had their chance to notice
    proxy.restore()
    app.tasks["eo.flaky"].delay(2)
    assert wait_until(lambda: counts([worker], "start")[2] >= 2, timeout=30), worker.log_text()
    name = re.escape(proxy.host_port)
    assert wait_until(lambda: _lines(worker.log_text(), f"broker {name} is up again"), 20)
    log = worker.log_text()
    assert len(_lines(log, f"broker {name} is down")) == 1, log[-4000:]
    assert len(_lines(log, f"broker {name} is up again")) == 1, log[-4000:]
