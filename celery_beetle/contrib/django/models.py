"""The outbox tables as Django models, column for column those of
:mod:`celery_beetle.outbox.table` (the relay reads them through SQLAlchemy; a test compares
the two schemas). Rows are written by :mod:`.db`; the models serve the migration, the
admin and queries of your own."""

from __future__ import annotations

from django.db import models


class _Row(models.Model):
    id = models.UUIDField(primary_key=True)
    task_name = models.CharField(max_length=255)
    exchange = models.CharField(max_length=255, db_default="")
    routing_key = models.CharField(max_length=255)
    body = models.BinaryField()
    headers = models.JSONField()
    properties = models.JSONField()
    declare = models.JSONField(null=True)
    scheduled_at = models.DateTimeField()
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    attempts = models.IntegerField(db_default=0)
    ordering_key = models.CharField(max_length=255, null=True)

    class Meta:
        abstract = True


class OutboxRow(_Row):
    """A task committed and not yet relayed."""

    last_error = models.TextField(null=True)

    class Meta:
        db_table = "beetle_outbox"
        indexes = [
            models.Index(fields=["scheduled_at", "id"], name="beetle_outbox_due"),
            models.Index(
                fields=["ordering_key", "id"],
                name="beetle_outbox_key",
                condition=models.Q(ordering_key__isnull=False),
            ),
        ]


class AsideRow(_Row):
    """A row the relay would not publish, with the reason; waits for an operator."""

    reason = models.TextField()
    moved_at = models.DateTimeField()

    class Meta:
        db_table = "beetle_outbox_aside"
        indexes = [
            models.Index(
                fields=["ordering_key"],
                name="beetle_outbox_aside_key",
                condition=models.Q(ordering_key__isnull=False),
            ),
        ]


class InboxRow(models.Model):
    """A message whose body committed its effects, until its dedup window ends."""

    pk = models.CompositePrimaryKey("scope", "message_id", "step")
    scope = models.CharField(max_length=255)
    message_id = models.CharField(max_length=255)
    step = models.CharField(max_length=64, db_default="")
    task_name = models.CharField(max_length=255)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "beetle_inbox"
        indexes = [models.Index(fields=["expires_at"], name="beetle_inbox_expires")]
