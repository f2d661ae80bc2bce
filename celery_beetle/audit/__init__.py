"""The delivery audit: proves from trace events that no message was lost or run twice.

``beetle audit TRACE_PATH --out DIR`` (see :mod:`celery_beetle.cli`) runs it on Spark.
:mod:`.schema` holds the event schema and the verdict names, :mod:`.transforms` the pure
DataFrame logic, :mod:`.job` the Spark session and I/O, :mod:`.report` the HTML report.
Nothing is imported here, so importing the package does not start or even import Spark.
"""

from __future__ import annotations
