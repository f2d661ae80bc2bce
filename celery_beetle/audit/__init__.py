"""The delivery audit: proves from trace events that no message was lost or run twice.

``beetle audit TRACE_PATH --out DIR`` (:mod:`.cli`, assembled on ``beetle`` by
:mod:`celery_beetle.cli`) runs it on Spark. :mod:`.schema` holds the event schema and the
verdict names, :mod:`.transforms` the pure DataFrame logic up to one verdict per message,
:mod:`.aggregates` what the summary reads off that table, :mod:`.numeric` the same facts
from numbers only, :mod:`.job` the Spark session and I/O, :mod:`.report` the HTML report,
:mod:`.naive` the same verdict in one process; :mod:`.class_cache` and :mod:`.warm` make
Spark's JVM start sooner. Nothing is imported here, so importing the package does not start
or even import Spark.

The audit reads trace files, never brokers or the store: of the transport it takes only the
trace's schema, :mod:`kombu_beetle.trace` (``tests/unit/test_import_rules.py`` checks):

:May import: ``kombu_beetle``
:Not imported by: ``kombu_beetle``, ``celery_beetle.store``, ``celery_beetle.worker``,
    ``celery_beetle.settings``, ``celery_beetle.metrics``, ``celery_beetle.task``,
    ``celery_beetle.ops``, ``celery_beetle.outbox``
"""

from __future__ import annotations
