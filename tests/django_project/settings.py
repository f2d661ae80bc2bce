"""A Django project using ``celery_beetle.contrib.django`` (tests/outbox/test_django.py).

The database is the test's throwaway PostgreSQL: ``BEETLE_DJANGO_DB`` holds its URL.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

_db = urlsplit(os.environ.get("BEETLE_DJANGO_DB", "postgresql://beetle@127.0.0.1:5432/shop"))

SECRET_KEY = "not-a-secret: tests only"
USE_TZ = True
INSTALLED_APPS = ["celery_beetle.contrib.django", "tests.django_project.shop"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.path.lstrip("/"),
        "USER": _db.username or "",
        "PASSWORD": _db.password or "",
        "HOST": _db.hostname or "",
        "PORT": str(_db.port or ""),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
