"""The same audit job on a Spark standalone cluster: a master and a worker started locally.

``beetle audit --master spark://…`` must give the verdict ``local[*]`` gives; the job has
no Python UDFs, so executors need nothing but the JVM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.gen_trace import Plan, generate
from celery_beetle.testing.ports import free_port

pytestmark = pytest.mark.spark


def _spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


@pytest.fixture
def standalone_cluster(tmp_path: Path) -> Iterator[str]:
    port, ui, worker_ui = free_port(), free_port(), free_port()
    env = {**os.environ, "SPARK_LOG_DIR": str(tmp_path), "SPARK_WORKER_DIR": str(tmp_path / "w")}
    master_url = f"spark://127.0.0.1:{port}"
    logs = [(tmp_path / "master.log").open("wb"), (tmp_path / "worker.log").open("wb")]
    procs = [
        subprocess.Popen(
            [str(_spark_class()), "org.apache.spark.deploy.master.Master",
             "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)],
            env=env, stdout=logs[0], stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            [str(_spark_class()), "org.apache.spark.deploy.worker.Worker", master_url,
             "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
             "--webui-port", str(worker_ui)],
            env=env, stdout=logs[1], stderr=subprocess.STDOUT,
        ),
    ]  # fmt: skip
    deadline = time.monotonic() + 60
    while b"Successfully registered with master" not in (tmp_path / "worker.log").read_bytes():
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            for p in procs:
                p.kill()
            pytest.fail("the standalone Spark cluster did not start:\n"
                        + (tmp_path / "worker.log").read_text()[-2000:])  # fmt: skip
        time.sleep(0.3)
    yield master_url
    for p in procs:
        p.kill()
        p.wait()
    for log in logs:
        log.close()


def test_the_audit_runs_unchanged_on_a_standalone_cluster(standalone_cluster, tmp_path, spark):
    expected = generate(Plan(messages=300, lost=2, duplicated=1, dead_lettered=3, procs=1,
                             files_per_proc=2), tmp_path / "trace")  # fmt: skip
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "celery_beetle.cli", "audit", str(tmp_path / "trace"),
         "--out", str(out), "--master", standalone_cluster, "--driver-memory", "1g", "--quiet"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]  # lost and duplicated are planted
    summary = json.loads((out / "summary.json").read_text())
    for key in ("messages", "completed_once", "lost", "duplicated", "dead_lettered"):
        assert summary[key] == expected[key], key
