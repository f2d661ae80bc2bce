"""Operating beetle: queue properties as RabbitMQ policies, and dead letters.

================  ==========================================================================
module            what it holds
================  ==========================================================================
``management``    a small client of RabbitMQ's management HTTP API, one per broker
``policies``      queue properties as one policy per queue on every broker (plan, apply, and
                  a background applier for workers)
``dead_letters``  browse, show and replay the messages in ``<queue>.dead``
``replay``        the replay rules (pure) that make a replay run a message exactly once
================  ==========================================================================

Each operation is a Python function first; ``beetle`` (:mod:`celery_beetle.cli`) is a thin
layer over them.
"""
