"""celery_beetle: exactly-once execution of Celery tasks over kombu_beetle.

The worker side of the project: a Redis deduplication store, a consumer bootstep
that gates deliveries before the pool, and the opt-in ``BeetleTask`` base class.
"""

from __future__ import annotations

__all__: list[str] = []
