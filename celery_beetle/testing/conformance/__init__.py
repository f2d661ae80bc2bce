"""Celery's own integration suites, run with every task a BeetleTask and compared with pyamqp.

The best outside judge of "a drop-in base class" is the host's own test suite: Celery's sdist
ships ``t/integration`` (``test_tasks.py``, ``test_canvas.py``), which runs against any broker
(``TEST_BROKER``) and result backend (``TEST_BACKEND``) with Celery's in-process test worker.

- :mod:`.sdists`: the installed Celery's sdist from PyPI, its ``t/`` unpacked once.
- :mod:`.overrides`: the fixtures a conftest placed beside the suite imports: every task a
  BeetleTask (``task_cls``) and ``celery_beetle.install`` on the suite's apps.
- :mod:`.results`: each test's outcome from pytest's JUnit XML, and the comparison of two runs.
- :mod:`.runner`: two local RabbitMQ nodes and a Redis, the suite run over ``beetle://`` and
  over ``pyamqp://`` in the same session.
- :mod:`.cli`: ``python -m celery_beetle.testing.conformance`` (``scripts/conformance``).
"""

from __future__ import annotations
