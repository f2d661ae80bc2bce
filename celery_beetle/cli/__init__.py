"""The ``beetle`` command line (``beetle = celery_beetle.cli:main``; ``python -m
celery_beetle.cli`` runs it too).

===========  ===========================================================================
``group``    :func:`main`, the click group: it assembles the commands each wing keeps
             (``beetle audit`` in :mod:`celery_beetle.audit.cli`, ``beetle dead-letters``,
             ``queues`` and ``fleet`` in :mod:`celery_beetle.ops.cli`, ``beetle outbox``
             and ``relay`` in :mod:`celery_beetle.outbox.cli`)
``status``   ``beetle status``, this wing's own command
``report``   what it asks each broker and the store
``top``      ``beetle status --watch``: the same, live, with the workers' metrics
===========  ===========================================================================

The command line sits on top: it may import the wings it assembles, and nothing imports it
(but ``python -m`` and the console script). ``tests/unit/test_import_rules.py`` checks:

:May import: ``kombu_beetle``, ``celery_beetle.settings``, ``celery_beetle.store``,
    ``celery_beetle.audit``, ``celery_beetle.ops``, ``celery_beetle.outbox``
:Not imported by: ``kombu_beetle``, ``celery_beetle.store``, ``celery_beetle.worker``,
    ``celery_beetle.settings``, ``celery_beetle.metrics``, ``celery_beetle.censor``,
    ``celery_beetle.task``, ``celery_beetle.audit``, ``celery_beetle.ops``,
    ``celery_beetle.outbox``, ``celery_beetle.contrib``, ``celery_beetle.testing``
"""

from __future__ import annotations

from celery_beetle.cli.group import main

__all__ = ["main"]
