"""``beetle queues plan`` / ``apply``: a diff per broker, exit 2 on drift, then in sync."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from celery_beetle.cli import main

pytestmark = pytest.mark.integration


def test_plan_exits_2_on_drift_apply_fixes_it_and_plan_then_exits_0(brokers, tmp_path):
    config = tmp_path / "policies.json"
    config.write_text(json.dumps({"queues": {"orders": {"message_ttl_ms": 60000}}}))
    args = ["--config", str(config), "--broker", brokers.beetle_url]
    for node in brokers.nodes:
        args += ["--management-url", f"{node.host_port}=http://{node.host}:{node.management_port}"]
    runner = CliRunner()
    planned = runner.invoke(main, ["queues", "plan", *args])
    assert planned.exit_code == 2, planned.output
    assert planned.output.count("create policy beetle.orders") == 3
    assert planned.output.count("declare queue orders.dead") == 3
    applied = runner.invoke(main, ["queues", "apply", *args])
    assert applied.exit_code == 0, applied.output
    assert "6 write(s)" in applied.output
    again = runner.invoke(main, ["queues", "plan", *args])
    assert again.exit_code == 0, again.output
    assert again.output.count("up to date") == 3


def test_a_property_no_policy_can_set_is_refused_with_a_pointer_to_migration(brokers, tmp_path):
    config = tmp_path / "policies.json"
    config.write_text(json.dumps({"queues": {"orders": {"queue_type": "quorum"}}}))
    result = CliRunner().invoke(
        main, ["queues", "plan", "--config", str(config), "--broker", brokers.beetle_url]
    )
    assert result.exit_code == 2
    assert "migration" in result.output
