"""The relay deletes a pass's rows with one statement whatever their count."""

from __future__ import annotations

from types import SimpleNamespace

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from celery_beetle.outbox.relay import _with_ids
from celery_beetle.outbox.table import OUTBOX


def _sql(dialect: sa.Dialect, count: int) -> tuple[str, dict[str, object]]:
    conn = SimpleNamespace(dialect=dialect)
    ids = [f"00000000-0000-7000-8000-{i:012d}" for i in range(count)]
    compiled = sa.delete(OUTBOX).where(_with_ids(conn, ids)).compile(dialect=dialect)  # type: ignore[arg-type]
    return str(compiled), compiled.params


def test_on_postgresql_the_ids_go_as_one_array_and_the_statement_is_the_same_for_any_count():
    dialect = postgresql.psycopg.dialect()  # type: ignore[attr-defined]
    (one, _), (many, many_params) = _sql(dialect, 1), _sql(dialect, 500)
    assert one == many and "= ANY" in many
    assert len(many_params) == 1 and len(next(iter(many_params.values()))) == 500


def test_elsewhere_the_ids_go_as_an_in_list():
    sql, _ = _sql(sqlite.dialect(), 3)
    assert " IN " in sql
