"""A local audit's JVM start is quiet: Spark's noise filtered, real errors kept (#27.6)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from celery_beetle.audit import quiet
from celery_beetle.audit.report import series_label


def test_the_jvms_start_lines_are_noise_and_an_error_is_not():
    assert quiet.is_noise("WARNING: Using incubator modules: jdk.incubator.vector")
    assert quiet.is_noise("26/11/24 23:28:23 WARN NativeCodeLoader: Unable to load native-hadoop")
    assert not quiet.is_noise("23:28:23 ERROR Executor: Exception in task 0.0")


def test_a_child_started_inside_the_filter_loses_its_noise_and_keeps_its_errors():
    code = textwrap.dedent(
        """
        import subprocess, time
        from celery_beetle.audit import quiet
        with quiet.filtered_stderr():
            child = subprocess.Popen(["sh", "-c",
                "sleep 0.2; echo 'WARNING: Using incubator modules: x' >&2;"
                " echo 'ERROR Executor: it broke' >&2"])
        child.wait()
        time.sleep(0.3)
        import sys; sys.stderr.write("the parent writes to the real stderr\\n")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)

    assert out.returncode == 0, out.stderr
    assert "incubator" not in out.stderr
    assert "ERROR Executor: it broke" in out.stderr
    assert "the parent writes to the real stderr" in out.stderr


def test_a_timeline_series_without_a_broker_is_labelled_for_what_it_is():
    assert series_label("127.0.0.1:5672") == "127.0.0.1:5672"
    assert series_label("?") == "all brokers (the event names none)"
