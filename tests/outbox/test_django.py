"""The outbox and the inbox through Django (``celery_beetle.contrib.django``): the test
project in tests/django_project, migrated into a fresh database of the throwaway
PostgreSQL; rows written inside ``transaction.atomic()`` and relayed by the SQLAlchemy relay.
"""

from __future__ import annotations

import os
import uuid
from types import SimpleNamespace

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from kombu import Connection

from celery_beetle.outbox.db import engine_for
from celery_beetle.outbox.enqueue import OutboxError
from celery_beetle.outbox.inbox import InboxError
from celery_beetle.outbox.relay import Relay
from celery_beetle.outbox.table import metadata
from tests.chaos.run import FAST
from tests.exactly_once.app import make_app

django = pytest.importorskip("django")


#: the database Django was set up with in this process: its settings are read once, so a
#: second setup (this module's fixture made again, when pytest-xdist ran another module's
#: tests between this one's) must use the same database
_SET_UP: list[str] = []


@pytest.fixture(scope="module")
def django_db(postgres):
    """The test project set up against a fresh database, migrated; its URL."""
    from django.core.management import call_command

    url = _SET_UP[0] if _SET_UP else postgres.create_database(f"dj_{uuid.uuid4().hex[:12]}")
    names = ("BEETLE_DJANGO_DB", "DJANGO_SETTINGS_MODULE")
    saved = {name: os.environ.get(name) for name in names}
    os.environ["BEETLE_DJANGO_DB"] = url.replace("postgresql+psycopg://", "postgresql://")
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django_project.settings"
    if not _SET_UP:
        django.setup()
        call_command("migrate", verbosity=0)
        _SET_UP.append(url)
    try:
        yield url
    finally:
        from django.db import connections

        connections.close_all()
        # a worker started by a later test inherits the environment: with this left set,
        # Celery's Django fix-up would set up this project in it (and fail outside the repo)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def test_the_django_migration_makes_the_tables_the_relay_reads(django_db):
    engine = engine_for(django_db)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    engine.dispose()
    # Django's own tables and the shop's are not the outbox's business
    assert [d for d in diff if "beetle_" in str(d)] == []


def test_a_task_enqueued_in_an_atomic_block_commits_with_the_data_and_is_relayed(
    django_db, brokers, redis_url
):
    from django.db import transaction

    from celery_beetle.contrib import django as beetle
    from tests.django_project.shop.models import Order

    app = make_app(brokers.beetle_url, redis_url, transport_options=dict(FAST),
                   conf={"beetle_outbox_notify": True})  # fmt: skip
    task = app.tasks["eo.record"]
    with transaction.atomic():
        kept = beetle.delay(task, 1)
        Order.objects.create(total=1, task_id=kept.id)
    with pytest.raises(RuntimeError), transaction.atomic():
        lost = beetle.apply_async(task, (2,), ordering_key="customer-2")
        Order.objects.create(total=2, task_id=lost.id)
        raise RuntimeError("rolled back")
    with pytest.raises(OutboxError, match="atomic"):
        beetle.delay(task, 3)
    assert list(Order.objects.values_list("task_id", flat=True)) == [kept.id]
    engine = engine_for(django_db)
    with Connection(brokers.beetle_url, transport_options=dict(FAST)) as conn:
        conn.ensure_connection(max_retries=3)
        assert Relay(engine, conn.channel()).relay_once().relayed == [kept.id]
    engine.dispose()


def test_inbox_once_in_an_atomic_block_is_true_for_the_first_commit_only(django_db):
    from django.db import transaction

    from celery_beetle.contrib import django as beetle

    app = make_app("beetle://", "redis://127.0.0.1:1/0")
    message_id = str(uuid.uuid4())
    request = SimpleNamespace(
        id=message_id, task="eo.record", called_directly=False, is_eager=False,
        delivery_info={"routing_key": "celery"}, properties={"message_id": message_id},
    )  # fmt: skip
    with pytest.raises(RuntimeError), transaction.atomic():
        assert beetle.inbox_once(request, app=app)
        raise RuntimeError("rolled back: the mark goes with it")
    with transaction.atomic():
        assert beetle.inbox_once(request, app=app)
    with transaction.atomic():
        assert not beetle.inbox_once(request, app=app)
    with pytest.raises(InboxError, match="atomic"):
        beetle.inbox_once(request, app=app)
