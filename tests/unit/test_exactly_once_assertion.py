"""The plugin's exactly-once assertion fails with the verdict, naming the bad ids."""

from __future__ import annotations

import pytest

from celery_beetle.testing.verdict import (
    ExactlyOnceError,
    assert_exactly_once,
    judge_trace,
    wait_for_outcomes,
)
from tests.audit.conftest import TraceBuilder


def _trace(tmp_path, build) -> TraceBuilder:
    trace = TraceBuilder()
    build(trace)
    trace.write(tmp_path)
    return trace


def test_a_trace_where_each_message_ran_once_passes(tmp_path):
    _trace(tmp_path, lambda t: t.published("a", 1).run("a", 2, 3).published("b", 1).run("b", 2, 3))
    verdict = assert_exactly_once(tmp_path, expected=2)
    assert verdict.counts["completed_once"] == 2


def test_a_message_run_twice_fails_with_its_id(tmp_path):
    _trace(tmp_path, lambda t: t.published("a", 1).run("a", 2, 3).run("a", 5, 6, worker="w2"))
    with pytest.raises(ExactlyOnceError, match=r"1 duplicated: q/a") as info:
        assert_exactly_once(tmp_path)
    assert info.value.verdict.ids["duplicated"] == ["q/a"]


def test_a_confirmed_message_that_never_ran_fails_as_lost(tmp_path):
    _trace(tmp_path, lambda t: t.published("a", 1).run("a", 2, 3).published("gone", 1))
    with pytest.raises(ExactlyOnceError, match=r"1 lost: q/gone"):
        assert_exactly_once(tmp_path)


def test_fewer_messages_than_expected_fail(tmp_path):
    _trace(tmp_path, lambda t: t.published("a", 1).run("a", 2, 3))
    with pytest.raises(ExactlyOnceError, match=r"1 of 3 expected messages ran exactly once"):
        assert_exactly_once(tmp_path, expected=3)


def test_a_dead_lettered_message_is_not_exactly_once(tmp_path):
    def build(t: TraceBuilder) -> None:
        t.published("a", 1).run("a", 2, 3, outcome="failed").ev("dead_lettered", "a", 3.1)

    _trace(tmp_path, build)
    with pytest.raises(ExactlyOnceError, match="not run to completion"):
        assert_exactly_once(tmp_path)


def test_an_empty_trace_fails_rather_than_passing_vacuously(tmp_path):
    with pytest.raises(ExactlyOnceError, match="holds no message"):
        assert_exactly_once(tmp_path / "nothing-here")


def test_waiting_for_outcomes_gives_up_after_its_timeout_with_the_last_verdict(tmp_path):
    _trace(tmp_path, lambda t: t.published("gone", 1))
    assert judge_trace(tmp_path).counts["lost"] == 1
    assert wait_for_outcomes(tmp_path, timeout=0.3, interval=0.1).counts["lost"] == 1


def test_a_lost_message_whose_body_began_names_the_lease_it_waits_for(tmp_path):
    _trace(tmp_path, lambda t: t.published("a", 1).ev("started", "a", 2))
    with pytest.raises(ExactlyOnceError, match=r"1 of the lost began a body .* its lease"):
        assert_exactly_once(tmp_path)


def test_a_lost_message_that_never_began_has_no_lease_hint(tmp_path):
    _trace(tmp_path, lambda t: t.published("a", 1))
    with pytest.raises(ExactlyOnceError) as info:
        assert_exactly_once(tmp_path)
    assert "lease" not in str(info.value)
