from __future__ import annotations

from django.apps import AppConfig


class BeetleConfig(AppConfig):
    name = "celery_beetle.contrib.django"
    label = "celery_beetle"
    verbose_name = "celery-beetle outbox and inbox"
