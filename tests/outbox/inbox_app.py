"""Worker app for the inbox scenarios: :mod:`tests.exactly_once.app` plus two tasks whose
effect is a row in ``effects`` of the database ``BEETLE_TEST_DB``:

- ``eo.effect(item)`` marks its message in the inbox in the same transaction;
- ``eo.effect_plain(item)`` does not (the control: a crash after its commit repeats it).

The crash point: when the directory ``BEETLE_TEST_CRASH_DIR`` is set, a run that committed
kills its own process (SIGKILL) right after the commit, before the Redis completion, at
the chance ``BEETLE_TEST_CRASH_CHANCE``, once per item (a file per item records the crash,
so the next run of that item gets past the crash point).
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import Session

from celery_beetle import BeetleTask
from celery_beetle.outbox import inbox
from tests.exactly_once import app as base

EFFECTS = sa.Table(
    "effects",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("item", sa.Integer, nullable=False),  # no unique key: a repeat shows
    sa.Column("message_id", sa.String(255), nullable=False),
)

app = base.app
#: an engine per process: a pool process must not share its parent's connections
_engines: dict[int, sa.Engine] = {}
_OPTIONS = {**base.DEFAULT_OPTIONS, **json.loads(os.environ.get("BEETLE_TEST_TASK", "{}"))}


def engine() -> sa.Engine:
    pid = os.getpid()
    if pid not in _engines:
        from celery_beetle.outbox.db import engine_for

        _engines[pid] = engine_for(os.environ["BEETLE_TEST_DB"], pool_size=1)
    return _engines[pid]


def _note(event: str, item: int) -> None:
    with open(os.environ.get("BEETLE_TEST_OUT", "/dev/null"), "a") as f:
        f.write(f"{event} {item} {os.getpid()} 0\n")


def _maybe_crash(item: int) -> None:
    crash_dir = os.environ.get("BEETLE_TEST_CRASH_DIR")
    if not crash_dir:
        return
    marker = Path(crash_dir) / str(item)
    if marker.exists() or random.random() >= float(os.environ.get("BEETLE_TEST_CRASH_CHANCE", "1")):
        return
    marker.touch()
    os.kill(os.getpid(), signal.SIGKILL)


def _run(request: object, item: int, use_inbox: bool) -> None:
    _note("start", item)
    with Session(engine()) as session, session.begin():
        if use_inbox and not inbox.once(session, request):
            _note("skip", item)
            return
        message_id = str(getattr(request, "id", ""))
        session.execute(sa.insert(EFFECTS), [{"item": item, "message_id": message_id}])
    _maybe_crash(item)  # committed, the completion not yet stored
    _note("done", item)


@app.task(base=BeetleTask, name="eo.effect", bind=True, shared=False, **_OPTIONS)
def effect(self: BeetleTask, item: int) -> None:
    _run(self.request, item, use_inbox=True)


@app.task(base=BeetleTask, name="eo.effect_plain", bind=True, shared=False, **_OPTIONS)
def effect_plain(self: BeetleTask, item: int) -> None:
    _run(self.request, item, use_inbox=False)
