"""What runs inside a Celery worker: the gate in the main process, the run in the pool.

See :mod:`celery_beetle.worker.bootstep` (the consumer bootstep that puts the gate in front of
every BeetleTask), :mod:`celery_beetle.worker.gate` (what the gate does with each delivery)
and :mod:`celery_beetle.worker.run` (one run of a body in a pool process).
"""
