from __future__ import annotations

from django.db import models


class Order(models.Model):
    total = models.IntegerField()
    task_id = models.CharField(max_length=64)
