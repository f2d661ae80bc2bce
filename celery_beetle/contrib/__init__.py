"""Integrations with other frameworks (each an optional extra).

Each builds on the wing it brings to the framework (``django``: the outbox and the inbox;
``tests/unit/test_import_rules.py`` checks):

:May import: ``celery_beetle.outbox``
:Not imported by: ``kombu_beetle``, ``celery_beetle.store``, ``celery_beetle.worker``,
    ``celery_beetle.settings``, ``celery_beetle.metrics``, ``celery_beetle.task``,
    ``celery_beetle.ops``, ``celery_beetle.outbox``, ``celery_beetle.audit``
"""
