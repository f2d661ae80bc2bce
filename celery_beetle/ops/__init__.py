"""Operating beetle: queue properties as RabbitMQ policies, dead letters, live queue
migration and the fleet view.

====================  ==========================================================================
module                what it holds
====================  ==========================================================================
``management``        a small client of RabbitMQ's management HTTP API, one per broker
``policies``          queue properties as one policy per queue on every broker (plan, apply)
``applier``           applying them from workers in the background, one worker per fleet
``dead_letters``      browse, show and purge the messages in ``<queue>.dead`` on every broker
``replay``            publish dead letters back so that each runs exactly once (the rule it
                      asks the store for is :func:`celery_beetle.store.outcome.decide_replay`)
``worker``            the worker bootstep that keeps its queues' policies applied
``migrate``           live queue migration (``beetle queues migrate``): the steps
``migration_state``   where a migration stands, kept in the dedup store; one process per queue
``mover``             moving a queue's messages on one broker, acked once confirmed
``fleet``             every consumer on every broker: beetle, older beetle or plain
``cli``               the wing's commands for ``beetle``: ``dead-letters``
                      (``cli_dead_letters``), ``queues`` and ``fleet`` (``cli_queues``),
                      and the options they share (``cli_options``)
====================  ==========================================================================

Each operation is a Python function first; ``beetle`` (:mod:`celery_beetle.cli`) is a thin
layer over them.

The operator's tools build on the worker (its dead-letter names) and the store (replays,
migration state); nothing below them imports them, and the worker's steps
(:mod:`.worker`, :mod:`.handback_control`) are added by :func:`celery_beetle.install`
(``tests/unit/test_import_rules.py`` checks):

:May import: ``kombu_beetle``, ``celery_beetle.store``, ``celery_beetle.worker``,
    ``celery_beetle.settings``
:Not imported by: ``kombu_beetle``, ``celery_beetle.store``, ``celery_beetle.worker``,
    ``celery_beetle.settings``, ``celery_beetle.metrics``, ``celery_beetle.censor``,
    ``celery_beetle.task``, ``celery_beetle.outbox``, ``celery_beetle.audit``
"""
