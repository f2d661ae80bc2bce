"""``beetle outbox init --help`` names every table the command creates."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from celery_beetle.cli import main

sa = pytest.importorskip("sqlalchemy")


def test_outbox_init_help_names_every_table_it_creates_the_inbox_included():
    from celery_beetle.outbox.table import metadata

    result = CliRunner().invoke(main, ["outbox", "init", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    help_text = " ".join(result.output.split())
    assert "beetle_inbox" in metadata.tables
    for table in metadata.tables:
        assert table in help_text, f"{table} not named in: {help_text}"
