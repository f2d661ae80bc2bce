"""What runs inside a Celery worker: the gate in the main process, the run in the pool.

``celery_beetle.install(app)`` adds the consumer bootstep; from then on every BeetleTask
delivery passes the gate in the worker's main process (one Redis call, pipelined on the
event loop) before it may take a pool slot, and its body runs in the pool under a lease.

======================  ==============================================================
the main process
``bootstep``            the consumer bootstep: validates the settings at start, puts the
                        gate in front of each BeetleTask's strategy, serves the metrics
``gate``                :class:`~.gate.DeliveryGate`: what it finds and decides for each
                        delivery (run, drop a duplicate, defer, hold a twin, hand back)
``held``                the copies it does not run now: dropped, deferred, twins, handed back
``gate_claims``         its claims: reservations renewed, completions stored before the ack
``gate_reads``          the gate's Redis calls, pipelined on the event loop
``outage``              the gate while Redis is unavailable: parked, probing, resuming
``bad_input``           deliveries the gate cannot run: bad input, unknown tasks
``handback``            requeueing a delivery after a backoff, never acking it
``renewal``             a delivery a quorum queue counted often, replaced by a fresh copy
``metrics``             the gate's counts, read when Prometheus scrapes
``quorum``              what Celery does for quorum queues, and what beetle turns off
the pool
``run``                 one run of a body: start (or claim), body, complete or fail; the
                        :class:`~.run.RunnableTask` protocol a BeetleTask meets
``errors``              what a run raises: the give-ups the result backend records
                        (exported by ``celery_beetle``), a dropped copy, a hand-back
``lease``               keeping a lease alive where the pool cannot cut a body short
``time_limits``         prefork's time limits counted from the stored start, not from
                        the moment a pool process took the job (both processes)
both
``facts``               a delivery's dedup identity and expiry, in its headers
``retry_queue``         retries through per-delay queues
``deadletter``          ``<queue>.dead``: where a message goes when it will not run again
======================  ==============================================================

The worker builds on the store (:mod:`celery_beetle.store`) and the public surface's
settings and metrics; the operator's tools (:mod:`celery_beetle.ops`, the outbox, the CLI)
build on the worker, never the other way round. ``tests/unit/test_import_rules.py`` checks:

:May import: ``kombu_beetle``, ``celery_beetle.store``, ``celery_beetle.settings``,
    ``celery_beetle.metrics``
:Not imported by: ``kombu_beetle``, ``celery_beetle.store``, ``celery_beetle.settings``,
    ``celery_beetle.metrics``, ``celery_beetle.censor``, ``celery_beetle.audit``
"""
