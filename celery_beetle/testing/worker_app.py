"""What the plugin's worker runs: ``celery -A celery_beetle.testing.worker_app worker``.

It imports the user's own app (``BEETLE_PYTEST_APP``) and points it at the test's brokers,
dedup store and trace (:func:`celery_beetle.testing.app.configure`), so the user's module
needs no test-only code.
"""

from __future__ import annotations

from celery_beetle.testing.app import app_from_env

app = app_from_env()
