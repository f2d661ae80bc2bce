"""The outbox and the inbox for Django: ``INSTALLED_APPS += ["celery_beetle.contrib.django"]``.

Its migration (``python manage.py migrate celery_beetle``) creates the same tables as
``beetle outbox init`` (``beetle_outbox``, ``beetle_outbox_aside``, ``beetle_inbox``), so
``beetle relay --db postgresql://…`` relays them unchanged. Enqueue and mark through
Django's own connection, inside ``transaction.atomic()``: the row commits or rolls back with
your data (no ``on_commit`` hook, which loses the task when the process dies after the
commit).

.. code-block:: python

    from django.db import transaction
    from celery_beetle.contrib import django as beetle

    with transaction.atomic():
        order = Order.objects.create(total=42)
        beetle.delay(charge, order.id)                 # charge.delay(order.id), in the txn

    @app.task(base=BeetleTask, bind=True)
    def charge(self, order_id):
        with transaction.atomic():
            if not beetle.inbox_once(self.request):
                return                                  # an earlier run committed it
            Charge.objects.create(order_id=order_id)

``using=`` picks another database alias. Needs the ``django`` extra (Django 5.2+: the inbox
model has a composite primary key) and the ``outbox`` extra for the relay.
"""

from __future__ import annotations

from typing import Any

__all__ = ["apply_async", "delay", "inbox_once"]


def delay(task: Any, *args: Any, **kwargs: Any) -> Any:
    """``task.delay(*args, **kwargs)`` as an outbox row in the current atomic block."""
    return apply_async(task, args, kwargs)


def apply_async(
    task: Any, args: Any = None, kwargs: Any = None, *, using: str = "default", **options: Any
) -> Any:
    """:func:`celery_beetle.outbox.apply_async` through Django's connection ``using``."""
    from celery_beetle.contrib.django.db import DjangoWriter
    from celery_beetle.outbox.enqueue import apply_async as enqueue

    return enqueue(DjangoWriter(using, "enqueue"), task, args, kwargs, **options)


def inbox_once(request: Any, *, step: str = "", using: str = "default", app: Any = None) -> bool:
    """:func:`celery_beetle.outbox.inbox.once` in the current atomic block of ``using``."""
    from celery_beetle.contrib.django.db import mark_once

    return mark_once(request, step=step, using=using, app=app)
