"""What runs inside a Celery worker: the gate in the main process, the run in the pool.

``celery_beetle.install(app)`` adds the consumer bootstep; from then on every BeetleTask
delivery passes the gate in the worker's main process (one Redis call, pipelined on the
event loop) before it may take a pool slot, and its body runs in the pool under a lease.

======================  ==============================================================
the main process
``bootstep``            the consumer bootstep: validates the settings at start, puts the
                        gate in front of each BeetleTask's strategy, serves the metrics
``strategy``            a BeetleTask's Celery strategy behind the gate
``gate``                :class:`~.gate.DeliveryGate`: wires the parts below and reads as
                        the path of a delivery; its verdict table
``verdict``             what the gate did with a delivery: one enum value per verdict
``deliveries``          what it holds: a delivery, a raw twin, the runs completed here
``held``                the holding table: dropped, deferred, waiting, parked, given back
``asking``              its question to Redis on the event loop, and the answer
``dispatch``            under prefork: fresh deliveries claimed in full as a process frees
``gate_claims``         the claim keeper: reservations renewed, completions before the ack
``ending``              how a run ends: finished, or handed back by the pool
``outage``              the gate while Redis is unavailable: parked, probing, resuming
``bad_input``           deliveries the gate cannot run: bad input, unknown tasks
``settle``              the gate's trace writer and its ack-after-trace rule
``gate_reads``          the gate's Redis calls, pipelined on the event loop
``handback``            requeueing a delivery after a backoff, never acking it
``renewal``             a delivery a quorum queue counted often, replaced by a fresh copy
``metrics``             the gate's counts, read when Prometheus scrapes
``quorum``              what Celery does for quorum queues, and what beetle turns off
the pool
``run``                 one run of a body: start (or claim), body, complete or fail
``runnable``            the :class:`~.runnable.RunnableTask` protocol a BeetleTask meets,
                        the process's store, a run's facts
``run_state``           what a pool process keeps between a run and Celery's signals
``run_calls``           a run's calls before the body, retried then handed back
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
