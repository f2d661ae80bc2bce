"""The transactional outbox: a task committed with the business data, relayed to two
brokers, run once.

A task published *before* the commit runs for data that may be rolled back; one published
*after* it is lost when the process dies in between. Written into the same transaction as
the data, it exists exactly when the data does; the relay publishes it afterwards, and the
dedup store makes the relay's one weakness (a crash between publish and delete publishes
the row again) harmless: the second copy has the same message id and is dropped.

Enqueue (``celery_beetle.outbox.enqueue``)::

    from celery_beetle import outbox

    with Session(engine) as session, session.begin():
        session.add(Order(id=7))
        outbox.delay(session, charge, 7)          # or outbox.apply_async(session, charge, ...)

Relay (``celery_beetle.outbox.relay``): ``beetle relay --db postgresql://… -A proj.celery:app``
as its own process (as many as you like), or inside workers with :func:`install_relay`.

Tables (``celery_beetle.outbox.table``): ``beetle outbox init --db …`` creates them; with
Alembic, add ``celery_beetle/outbox/migrations/versions`` to ``version_locations`` and upgrade
``beetle_outbox@head``. ``beetle outbox list`` / ``retry`` / ``drop`` show, requeue and
delete the rows the relay set aside. Needs the ``outbox`` extra (SQLAlchemy 2, psycopg 3,
Alembic).

Also: ``apply_async(..., ordering_key=…)`` publishes a key's tasks in order
(``celery_beetle.outbox.relay``); :func:`.inbox.once` commits a body's effects once
(:mod:`.inbox`); opt-in NOTIFY wake-ups (``celery_beetle.outbox.notify``); Django:
:mod:`celery_beetle.contrib.django`.

The outbox builds on the worker (the inbox marks a running body, :func:`.inbox.once`) and
the settings; it keeps its own collector (``celery_beetle.outbox.metrics``) and commands
(``celery_beetle.outbox.cli``), and nothing below it imports it
(``tests/unit/test_import_rules.py`` checks):

:May import: ``kombu_beetle``, ``celery_beetle.worker``, ``celery_beetle.settings``,
    ``celery_beetle.censor``
:Not imported by: ``kombu_beetle``, ``celery_beetle.store``, ``celery_beetle.worker``,
    ``celery_beetle.settings``, ``celery_beetle.metrics``, ``celery_beetle.censor``,
    ``celery_beetle.task``, ``celery_beetle.ops``, ``celery_beetle.audit``
"""

from __future__ import annotations

from typing import Any

__all__ = ["OutboxError", "Relay", "apply_async", "create_tables", "delay", "install_relay"]


def __getattr__(name: str) -> Any:
    # SQLAlchemy is an extra: import it when the outbox is used, not with celery_beetle
    if name in ("apply_async", "delay", "OutboxError"):
        from celery_beetle.outbox import enqueue

        return getattr(enqueue, name)
    if name == "Relay":
        from celery_beetle.outbox.relay import Relay

        return Relay
    if name == "create_tables":
        from celery_beetle.outbox.table import create_tables

        return create_tables
    if name == "install_relay":
        from celery_beetle.outbox.bootstep import install_relay

        return install_relay
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
