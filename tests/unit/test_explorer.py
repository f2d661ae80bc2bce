"""The fault explorer's pure parts, without servers: the seeded draw, the allowed table,
the checker's judgments, the ledger's parsing and the shrinker's candidates."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from celery_beetle.audit.naive import Verdict
from celery_beetle.testing.explorer import allowed, checker
from celery_beetle.testing.explorer.allowed import GIVE_UP
from celery_beetle.testing.explorer.ledger import note, read_dir
from celery_beetle.testing.explorer.scenario import (
    FIFTH_FAULTS,
    SIXTH_FAULTS,
    Fault,
    Item,
    Scenario,
    Settings,
    draw,
)
from celery_beetle.testing.explorer.shrink import candidates, regression_test_source
from celery_beetle.testing.explorer.timeline import timeline


def test_the_same_seed_draws_the_same_scenario():
    assert draw(42) == draw(42)
    assert draw(42).to_json() == draw(42).to_json()
    assert draw(42) != draw(43)


def test_a_scenario_survives_its_json():
    scenario = draw(7)
    assert Scenario.from_json(scenario.to_json()) == scenario


def test_the_draw_leans_to_the_defaults_and_reaches_every_feature():
    scenarios = [draw(seed) for seed in range(300)]
    attempts = Counter(s.settings.attempts for s in scenarios)
    assert attempts[1] > attempts[2] and attempts[1] > attempts[3]
    assert any(s.settings.acks_late is False for s in scenarios)
    assert any(s.settings.inbox for s in scenarios)
    assert any(i.countdown_s for s in scenarios for i in s.items)
    kinds = {f.kind for s in scenarios for f in s.faults}
    assert {"worker_kill", "worker_term", "migrate", "replay", "broker_kill"} <= kinds
    assert {"partition", "stall", "held_replies", "redis_partition"} <= kinds
    migrations = [s for s in scenarios if any(f.kind == "migrate" for f in s.faults)]
    assert any(
        any(f.kind.startswith("worker_") and f.at_s > m.at_s for f in s.faults)
        for s in migrations
        for m in s.faults
        if m.kind == "migrate"
    )


def test_the_ledger_reads_every_line_a_body_wrote_and_counts_torn_ones(tmp_path: Path):
    note(str(tmp_path), "start", "k1")
    note(str(tmp_path), "end", "k1")
    note(str(tmp_path), "start", "k2")
    with open(next(tmp_path.glob("ledger-*.jsonl")), "a") as f:
        f.write('{"ev": "start", "key"')  # a write cut by SIGKILL
    ledger = read_dir(tmp_path)
    assert len(ledger.entry("k1").starts) == 1 and len(ledger.entry("k1").ends) == 1
    assert len(ledger.entry("k2").starts) == 1 and not ledger.entry("k2").ends
    assert ledger.entry("absent").starts == []
    assert ledger.malformed == 1


def test_the_allowed_table_follows_the_readme():
    one = Settings(attempts=1, exceptions=0)
    three = Settings(attempts=3, exceptions=2)
    ok = Item(0, "work", "ok")
    assert allowed.expect(ok, one).outcomes == {"completed"}
    assert allowed.expect(Item(0, "work", "fatal"), three).outcomes == {"dead:not_retryable"}
    assert allowed.expect(Item(0, "work", "flaky"), one).outcomes == allowed.GIVE_UP
    assert allowed.expect(Item(0, "work", "flaky"), three).outcomes == {"completed"}
    assert allowed.expect(Item(0, "inbox"), one).outcomes == {"completed"}
    assert allowed.max_starts(one, replays=0) == 1
    assert allowed.max_starts(three, replays=1) == 6
    assert set(allowed.RULES) >= {"lost", "starts", "dead_never_started", "success_dead"}


def _evidence(key: str, item: Item, **fields: object) -> checker.Evidence:
    from celery_beetle.testing.explorer.ledger import Ledger

    counts = {"messages": 1, "lost": 0, "duplicated": 0, "unexpected": 0}
    base: dict[str, object] = {
        "confirmed": {key},
        "keys": {key: item},
        "trace": checker.Trace(),
        "ledger": Ledger(),
        "audit": Verdict(counts),
    }
    base.update(fields)
    return checker.Evidence(**base)  # type: ignore[arg-type]


def _scenario(settings: Settings, item: Item, *faults: Fault) -> Scenario:
    return Scenario(1, settings, (item,), faults)


def test_a_dead_letter_for_attempts_whose_body_never_started_is_a_violation():
    item = Item(0, "work", "ok")
    ev = _evidence("k", item)
    ev.trace.dead["k"].append("attempts_limit")
    rules = [v.rule for v in checker.judge(_scenario(Settings(), item), ev)]
    assert rules == ["dead_never_started"]


def _two_never_started(kills: int) -> list[str]:
    items = {k: Item(i, "work", "ok") for i, k in enumerate(("a", "b"))}
    ev = _evidence("a", items["a"], confirmed={"a", "b"}, keys=items)
    ev.faults["worker_kill"] = kills
    for key in items:
        ev.trace.dead[key].append("attempts_limit")
    scenario = Scenario(1, Settings(), tuple(items.values()), ())
    return sorted(v.rule for v in checker.judge(scenario, ev))


def test_one_message_one_start_short_per_killed_process_is_the_start_window():
    # killed between the stored start and the body's first line: an attempt used, no witness
    assert _two_never_started(kills=2) == []
    # more than the kills can explain: a claim counted as a start (#24.1)
    assert _two_never_started(kills=1) == ["dead_never_started", "dead_never_started"]
    assert _two_never_started(kills=0) == ["dead_never_started", "dead_never_started"]


def test_a_dead_letter_after_a_start_killed_mid_body_is_allowed():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "work", "ok")
    ledger = Ledger({"k": Entry(starts=[(10.0, 99)])})
    ev = _evidence("k", item, ledger=ledger, kills=[(11.0, {99})])
    ev.trace.dead["k"].append("attempts_limit")
    assert checker.judge(_scenario(Settings(), item), ev) == []


def test_a_body_that_returned_unkilled_and_was_dead_lettered_is_a_violation():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "work", "ok")
    ledger = Ledger({"k": Entry(starts=[(10.0, 99)], ends=[(10.5, 99)])})
    ev = _evidence("k", item, ledger=ledger, kills=[(9.0, {99})])
    ev.trace.dead["k"].append("attempts_limit")
    assert [v.rule for v in checker.judge(_scenario(Settings(), item), ev)] == ["success_dead"]


def test_a_completion_that_waited_for_redis_past_its_lease_may_lose_its_message():
    """Seed 5012: the body returned while Redis was down, the outage outlasted the lease, the
    twin dead-lettered it. The docs' rule (keep the lease longer than an outage) allows it;
    an outage that ended within the lease does not."""
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "work", "ok")
    settings = Settings(timeout_s=4.0)
    ledger = Ledger({"k": Entry(starts=[(10.0, 99)], ends=[(12.0, 99)])})
    for outage, rules in (((11.0, 16.0), []), ((11.0, 13.0), ["success_dead"])):
        ev = _evidence("k", item, ledger=ledger, redis_outages=[outage])
        ev.trace.dead["k"].append("attempts_limit")
        assert [v.rule for v in checker.judge(_scenario(settings, item), ev)] == rules, outage


def test_the_lease_of_a_completion_in_an_outage_counts_from_the_stored_start():
    """Seed 97014: the start was stored (traced) at 40.28, the body's first ledger line came
    at 41.12. An outage (a failover, no replica to acknowledge writes) from 40.36 to 45.5
    ended less than a second before the lease of 6 s counted from the stored start (46.28),
    but not from the ledger's (47.12). The completion may lose its message to another run,
    as the docs say ("longer than a failover by a second or more")."""
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "work", "ok")
    settings = Settings(timeout_s=6.0)
    ledger = Ledger({"k": Entry(starts=[(41.12, 99)], ends=[(42.37, 99)])})
    for started_at, rules in (([(40.28, 99)], []), ([], ["success_dead"])):
        ev = _evidence("k", item, ledger=ledger, redis_outages=[(40.36, 45.5)])
        ev.trace.dead["k"].append("attempts_limit")
        ev.trace.started_at["k"] = started_at
        assert [v.rule for v in checker.judge(_scenario(settings, item), ev)] == rules
    # another process's start says nothing of this run's lease
    ev = _evidence("k", item, ledger=ledger, redis_outages=[(40.36, 45.5)])
    ev.trace.dead["k"].append("attempts_limit")
    ev.trace.started_at["k"] = [(40.28, 98)]
    assert [v.rule for v in checker.judge(_scenario(settings, item), ev)] == ["success_dead"]


def test_outages_back_to_back_are_one_wait_for_a_completion():
    """Seed 112010: a chain link returned at 37.56 (stored start 37.34, lease 6 s) as Redis
    was cut off until 41.36, then refused writes until 42.66: one outage, which ended less
    than a second before the lease (43.34). The gate's completion waited past it, and the
    message ran again. Either fault alone, or the two over half a second apart, does not."""
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "work", "ok")
    settings = Settings(timeout_s=6.0, attempts=2)
    entry = Entry(starts=[(37.34, 99), (43.6, 98)], ends=[(37.56, 99), (43.82, 98)])
    partition, refusal = (37.5, 41.36), (41.36, 42.66)
    for outages, rules in (
        ([partition, refusal], []),
        ([refusal, partition], []),
        ([partition], ["ran_again"]),
        ([partition, (41.96, 42.66)], ["ran_again"]),
    ):
        ev = _evidence("k", item, ledger=Ledger({"k": entry}), redis_outages=outages)
        ev.trace.completed["k"] = 1
        ev.trace.started_at["k"] = [(37.34, 99), (43.6, 98)]
        assert [v.rule for v in checker.judge(_scenario(settings, item), ev)] == rules, outages


def _inbox_rules(
    committed: float, ended: float, outage: tuple[float, float], kills: list[Any] | None = None
) -> list[str]:
    """The rules an inbox message breaks whose one run (started at 40.28, lease 6 s)
    committed its effect at ``committed`` and returned at ``ended``, dead-lettered at
    ``attempts=1`` after a Redis ``outage``."""
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "inbox")
    entry = Entry(starts=[(40.3, 99)], ends=[(ended, 99)], committed=[(committed, 99)])
    ev = _evidence(
        "k", item, ledger=Ledger({"k": entry}), redis_outages=[outage], kills=kills or []
    )
    ev.trace.dead["k"].append("attempts_limit")
    ev.trace.started_at["k"] = [(40.28, 99)]
    ev.effects["k"] = 1
    return sorted(v.rule for v in checker.judge(_scenario(Settings(timeout_s=6.0), item), ev))


def test_an_inbox_commit_redis_could_not_mark_may_be_dead_lettered_when_cut_short():
    """Seed 97014: the body committed during a failover with wait_replicas, so its inbox mark
    was not stored, and its completion waited out its lease; at attempts=1 the next copy
    dead-lettered it (allowed.SIXTH_VERSION "inbox_unmarked"). A commit before the outage was
    marked (its run earns another start), and a completion stored in time is owed."""
    assert _inbox_rules(committed=42.03, ended=42.37, outage=(40.36, 46.65)) == []
    # killed after a commit in the outage: cut short, unmarked
    killed = [(43.0, {99})]
    assert _inbox_rules(committed=42.03, ended=42.37, outage=(40.36, 43.5), kills=killed) == []
    # committed before the outage: the mark was stored, another start finds the row
    assert _inbox_rules(committed=38.0, ended=42.37, outage=(40.36, 46.65)) == [
        "inbox_committed_dead"
    ]
    # the outage ended within the lease: the completion should have been stored
    assert _inbox_rules(committed=42.03, ended=42.37, outage=(40.36, 44.0)) == [
        "inbox_committed_dead",
        "success_dead",
    ]
    assert "inbox_unmarked" in allowed.SIXTH_VERSION


def test_no_outcome_is_lost_and_too_many_starts_break_attempts():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "work", "ok")
    assert [v.rule for v in checker.judge(_scenario(Settings(), item), _evidence("k", item))] == [
        "lost"
    ]
    ledger = Ledger({"k": Entry(starts=[(1.0, 1), (2.0, 2)], ends=[(2.5, 2)])})
    ev = _evidence("k", item, ledger=ledger)
    ev.trace.completed["k"] = 1
    assert [v.rule for v in checker.judge(_scenario(Settings(), item), ev)] == ["starts"]


def test_an_inbox_effect_committed_then_dead_lettered_is_a_violation():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "inbox")
    ledger = Ledger({"k": Entry(starts=[(1.0, 7)], committed=[(1.1, 7)])})
    ev = _evidence("k", item, ledger=ledger, kills=[(1.2, {7})], effects=Counter({"k": 1}))
    ev.trace.dead["k"].append("attempts_limit")
    rules = {v.rule for v in checker.judge(_scenario(Settings(), item), ev)}
    assert rules == {"inbox_committed_dead"}


def test_the_shrinker_proposes_fewer_messages_faults_and_workers():
    scenario = draw(11)
    scenario = scenario.but(settings=Settings(workers=3, brokers=3))
    smaller = list(candidates(scenario, keep={5}))
    assert len(smaller[0].items) < len(scenario.items)
    assert any(i.index == 5 for i in smaller[0].items)
    assert any(len(c.faults) < len(scenario.faults) for c in smaller)
    assert smaller[-1].settings.workers == 2 and smaller[-1].settings.brokers == 2
    source = regression_test_source(smaller[0], ["lost"])
    compile(source, "test_seed.py", "exec")
    assert f"SEED = {scenario.seed}" in source


def test_bad_input_must_be_dead_lettered_with_its_reason():
    item = Item(0, "bad", "undecodable")
    assert allowed.expect(item, Settings()).outcomes == {"dead:undecodable"}
    ev = _evidence("k", item, dead_letters={"k": {"undecodable"}})
    assert checker.judge(_scenario(Settings(), item), ev) == []
    ev = _evidence("k", item, dead_letters={"k": {"attempts_limit"}})
    assert [v.rule for v in checker.judge(_scenario(Settings(), item), ev)] == ["outcome"]
    assert any(i.kind == "bad" for seed in range(50) for i in draw(seed).items)


def test_a_surplus_copy_of_a_decided_message_left_in_a_queue_is_explained_and_others_not():
    item = Item(0, "work", "fatal")
    ev = _evidence("k", item, leftover={"b1/explore": ["k"]})
    ev.trace.dead["k"].append("not_retryable")
    assert checker.judge(_scenario(Settings(), item), ev) == []
    ev = _evidence("k", item, leftover={"b1/explore": ["k", "stranger"]})
    ev.trace.dead["k"].append("not_retryable")
    assert [v.rule for v in checker.judge(_scenario(Settings(), item), ev)] == ["leftover"]


def test_a_chains_second_task_runs_once_after_the_first_and_never_after_a_failure():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "chain", "ok")
    second = checker.second_key("k")
    ledger = Ledger({"k": Entry(starts=[(1.0, 5)], ends=[(1.1, 5)])})
    ev = _evidence("k", item, ledger=ledger)
    ev.trace.completed["k"] = 1
    assert checker.awaited({"k"}, {"k": item}, ev.trace) == {"k", second}
    assert [v.rule for v in checker.judge(_scenario(Settings(), item), ev)] == ["lost"]
    ev.trace.completed[second] = 1
    ev.ledger[second] = Entry(starts=[(2.0, 5)], ends=[(2.1, 5)])
    assert checker.judge(_scenario(Settings(), item), ev) == []

    fatal = Item(0, "chain", "fatal")
    ev = _evidence("k", fatal, ledger=Ledger({second: Entry(starts=[(2.0, 5)])}))
    ev.trace.dead["k"].append("not_retryable")
    assert [v.rule for v in checker.judge(_scenario(Settings(), fatal), ev)] == ["chain"]


def test_a_dead_letter_before_any_start_is_a_violation_even_if_a_replay_ran_it_later():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "work", "ok")
    ledger = Ledger({"k": Entry(starts=[(20.0, 5)], ends=[(20.1, 5)])})
    ev = _evidence("k", item, ledger=ledger)
    ev.trace.dead["k"].append("attempts_limit")
    ev.trace.first_dead_s["k"] = 10.0
    ev.trace.replays["k"] = 1
    ev.trace.completed["k"] = 1
    assert [v.rule for v in checker.judge(_scenario(Settings(), item), ev)] == [
        "dead_never_started"
    ]
    flaky = Item(0, "work", "flaky")
    assert allowed.expect(flaky, Settings(), replays=1).outcomes == {"completed"} | GIVE_UP


def test_a_flaky_body_dead_lettered_then_replayed_and_completed_is_correct():
    """Seed 5011: ``exceptions=0`` dead-letters its one failure; a replay runs it again."""
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "work", "flaky")
    ledger = Ledger({"k": Entry(starts=[(1.0, 5), (11.0, 5)], ends=[(11.4, 5)], fails=1)})
    ev = _evidence("k", item, ledger=ledger)
    ev.trace.dead["k"].append("exceptions_limit")
    ev.trace.first_dead_s["k"] = 1.4
    ev.trace.replays["k"] = 1
    ev.trace.completed["k"] = 1
    assert checker.judge(_scenario(Settings(attempts=2, exceptions=0), item), ev) == []


def test_a_body_started_again_after_one_returned_unkilled_is_a_violation():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "work", "ok")
    ledger = Ledger({"k": Entry(starts=[(1.0, 5), (3.0, 5)], ends=[(1.5, 5), (3.5, 5)])})
    ev = _evidence("k", item, ledger=ledger)
    ev.trace.completed["k"] = 1
    rules = [v.rule for v in checker.judge(_scenario(Settings(attempts=2), item), ev)]
    assert rules == ["ran_again"]
    ev = _evidence("k", item, ledger=ledger, kills=[(2.0, {5})])
    ev.trace.completed["k"] = 1
    assert checker.judge(_scenario(Settings(attempts=2), item), ev) == []


def test_a_copy_told_completed_by_the_store_counts_as_completed(tmp_path: Path):
    import json

    line = {"ts_ms": 1, "event": "duplicate", "message_id": "m", "queue": "q", "task_id": "k",
            "detail": {"status": "c"}}  # fmt: skip
    (tmp_path / "w.jsonl").write_text(json.dumps(line) + "\n")
    trace = checker.read_trace(tmp_path)
    assert trace.is_completed("k") and not trace.is_completed("other")


def test_the_trace_keeps_when_and_where_each_run_started(tmp_path: Path):
    import json

    lines = [
        {"ts_ms": 40281, "event": "started", "message_id": "k", "queue": "q", "task_id": "k",
         "pid": 99},
        {"ts_ms": 46500, "event": "started", "message_id": "k", "queue": "q", "task_id": "k",
         "pid": 98},
    ]  # fmt: skip
    (tmp_path / "w.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    trace = checker.read_trace(tmp_path)
    assert trace.started["k"] == 2
    assert trace.started_at["k"] == [(40.281, 99), (46.5, 98)]


def test_a_message_without_an_id_may_complete_once_a_replay_ran_its_dead_letter():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "bad", "no_message_id")

    def rules(replays: int) -> list[str]:
        ledger = Ledger({"k": Entry(starts=[(20.0, 5)], ends=[(20.1, 5)])})
        ev = _evidence("k", item, ledger=ledger)
        ev.faults["replay"] = replays
        ev.trace.dead["k"].append("no_message_id")
        ev.trace.completed["k"] = 1
        return [v.rule for v in checker.judge(_scenario(Settings(), item), ev)]

    # its dead letter got an id of its own: `dead replay --all` runs it once under that id
    assert rules(replays=1) == []
    assert "outcome" in rules(replays=0)


def test_a_flaky_body_whose_first_start_was_killed_may_complete_on_its_second():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "work", "flaky")
    settings = Settings(attempts=2, exceptions=0)

    def rules(kills: list[tuple[float, set[int]]]) -> list[str]:
        ledger = Ledger({"k": Entry(starts=[(10.0, 7), (20.0, 8)], ends=[(20.1, 8)])})
        ev = _evidence("k", item, ledger=ledger, kills=kills)
        ev.trace.completed["k"] = 1
        return [v.rule for v in checker.judge(_scenario(settings, item), ev)]

    assert rules([(11.0, {7})]) == []  # killed before it could fail: the 2nd start succeeds
    assert "outcome" in rules([])  # nothing killed it: its first start failed, for good


def test_a_failing_messages_timeline_merges_trace_ledger_and_logs_in_time_order(tmp_path: Path):
    (tmp_path / "trace").mkdir()
    (tmp_path / "ledger").mkdir()
    (tmp_path / "trace" / "vm-1-gate-20261124T000000Z-000.jsonl").write_text(
        '{"ts_ms": 1795562316199, "event": "dead_lettered", "task_id": "k-1", "pid": 7,'
        ' "message_id": "k-1", "detail": {"reason": "attempts_limit"}}\n'
        '{"ts_ms": 1795562316000, "event": "started", "task_id": "other", "pid": 7}\n'
    )
    note(str(tmp_path / "ledger"), "start", "k-1")
    (tmp_path / "worker0.log").write_text(
        "[2020-01-01 00:00:00,000: INFO/MainProcess] Task ex.work[k-1] received\n"
        "a traceback line about k-1 without a time\n"
    )

    rows = timeline(tmp_path, "k-1")

    assert [row.split()[1] for row in rows] == ["worker0", "trace", "ledger"]
    assert "dead_lettered" in rows[1] and "attempts_limit" in rows[1]
    assert all("other" not in row for row in rows)


def test_an_inbox_task_may_start_twice_more_than_attempts():
    """Seed 5066: the documented inbox allowance (a body that marked its commit and was cut
    short finds its row on the next run)."""
    assert allowed.max_starts(Settings(attempts=1), 0) == 1
    assert allowed.max_starts(Settings(attempts=1), 0, inbox=True) == 3


#: what the draw's first two versions make of a scenario: the settings, items and faults a
#: later version must leave as they were (it may only add items and faults of its own)
_V2_SETTINGS = ("attempts", "exceptions", "acks_late", "timeout_s", "prefetch_multiplier",
                "pool", "concurrency", "brokers", "workers", "inbox")  # fmt: skip
_V2_ITEM = ("index", "kind", "mode", "sleep_s", "at_s", "countdown_s")
_V2_KINDS = {"work", "inbox", "plain", "bad", "chain"}
_V2_FAULTS = {"worker_kill", "worker_term", "pool_kill", "broker_kill", "broker_freeze",
              "redis_kill", "redis_refuse", "script_flush", "migrate", "replay", "partition",
              "stall", "held_replies", "redis_partition", "redis_held_replies"}  # fmt: skip


def _v2_digest(scenario: Scenario) -> str:
    import hashlib
    import json

    view = {
        "seed": scenario.seed,
        "settings": {name: getattr(scenario.settings, name) for name in _V2_SETTINGS},
        "items": [
            [getattr(i, n) for n in _V2_ITEM]
            for i in scenario.items
            if i.kind in _V2_KINDS and not _fourth(i)
        ],
        "faults": [
            [f.at_s, f.kind, f.target, f.duration_s]
            for f in scenario.faults
            if f.kind in _V2_FAULTS
        ],
    }
    return hashlib.sha256(json.dumps(view, sort_keys=True).encode()).hexdigest()[:16]


def test_later_versions_of_the_draw_keep_every_existing_seeds_scenario():
    """Pinned on the draw's second version (before the third was added): a seed's settings,
    messages and faults stay what they were, so a seed replays the scenario it named."""
    pinned = {
        1000: "f4b3bb8116ab9753",
        5000: "9c43540e8a973462",
        1004: "aaf90218189f97b4",
        3022: "b7489814888bbf6e",
    }
    assert {seed: _v2_digest(draw(seed)) for seed in pinned} == pinned


def _fourth(item: Item) -> bool:
    """An item of the draw's fourth version: a chain of more than two links, a retry
    without a countdown or past its max_retries, a chord."""
    if item.kind == "chord":
        return True
    if item.kind == "chain":
        return bool(item.members)
    return item.kind == "retry" and (item.retry_s == 0 or item.mode == "past_max")


#: the fifth version's settings (and ``Fault.bound``), left out of what earlier versions pin
_FIFTH_SETTINGS = ("rabbit4", "consumer_timeout_ms")
#: the sixth version's settings (and ``Fault.lag_s``), left out of what earlier versions pin
_SIXTH_SETTINGS = ("sentinel", "wait_replicas", "untraced", "previous")


def _before_sixth(scenario: Scenario) -> dict[str, Any]:
    """``scenario`` as the fifth version drew it: without the sixth's settings and faults."""
    from dataclasses import asdict

    view = asdict(scenario)
    for name in _SIXTH_SETTINGS:
        del view["settings"][name]
    view["faults"] = [
        {k: v for k, v in asdict(f).items() if k != "lag_s"}
        for f in scenario.faults
        if f.kind not in SIXTH_FAULTS
    ]
    return view


def _v3_digest(scenario: Scenario) -> str:
    import hashlib
    import json
    from dataclasses import asdict

    view = _before_sixth(scenario)
    view["items"] = [asdict(i) for i in scenario.items if not _fourth(i)]
    for name in _FIFTH_SETTINGS:
        del view["settings"][name]
    view["faults"] = [
        {k: v for k, v in f.items() if k != "bound"}
        for f in view["faults"]
        if f["kind"] not in FIFTH_FAULTS
    ]
    return hashlib.sha256(json.dumps(view, sort_keys=True).encode()).hexdigest()[:16]


PINNED_V4 = {
    1000: "af049494b409d3df",
    1004: "61b8f0f9994e317e",
    3022: "adfac2e29832aae9",
    5000: "22ae8bdc4de19ca9",
    5071: "fba5258419a99c32",
    90003: "e216cfbfb1eeb91b",
}


def test_the_fourth_version_keeps_every_seeds_third_version_scenario():
    """Pinned on the draw's third version (before the fourth was added): the whole scenario
    but the fourth version's items stays what it was."""
    pinned = {
        1000: "89366be3fe529fed",
        1004: "5f486b904fdabbea",
        3022: "6126184c58a00606",
        5000: "1ca393fa34113fd8",
        5071: "cf9bcdb398ada62f",
        90003: "66b5397f31dff473",
    }
    assert {seed: _v3_digest(draw(seed)) for seed in pinned} == pinned


def test_the_fifth_version_keeps_every_seeds_fourth_version_scenario():
    """Pinned on the draw's fourth version (before the fifth was added): the whole scenario
    but the fifth version's settings and faults stays what it was."""
    import hashlib
    import json

    def digest(scenario: Scenario) -> str:
        view = _before_sixth(scenario)
        for name in _FIFTH_SETTINGS:
            del view["settings"][name]
        view["faults"] = [
            {k: v for k, v in f.items() if k != "bound"}
            for f in view["faults"]
            if f["kind"] not in FIFTH_FAULTS
        ]
        return hashlib.sha256(json.dumps(view, sort_keys=True).encode()).hexdigest()[:16]

    pinned = PINNED_V4
    assert {seed: digest(draw(seed)) for seed in pinned} == pinned


def test_the_fifth_version_draws_rabbitmq_4s_limits_and_queue_bounds_where_they_apply():
    scenarios = [draw(seed) for seed in range(400)]
    limited = [s for s in scenarios if s.settings.rabbit4]
    assert 0.12 < len(limited) / len(scenarios) < 0.28
    assert not any(f.kind == "migrate" for s in limited for f in s.faults)
    assert {s.settings.consumer_timeout_ms for s in limited} == {0, 5000, 10000}
    assert not any(s.settings.consumer_timeout_ms for s in scenarios if not s.settings.rabbit4)
    bounds = [f for s in scenarios for f in s.faults if f.kind == "queues_bound"]
    assert 0.08 < len(bounds) / len(scenarios) < 0.22
    assert {f.bound for f in bounds if f.target == 0} <= {200, 1000, 2000}
    assert {f.bound for f in bounds if f.target == 1} <= {2, 5, 10}
    assert {f.target for f in bounds} == {0, 1}


def test_a_message_a_queue_bound_dead_lettered_is_judged_dead_lettered_not_lost():
    item = Item(0, "work", "ok")
    key = "s1-0-x"
    bound = Fault(1.0, "queues_bound", 0, 3.0, bound=200)
    scenario = _scenario(Settings(), item, bound)

    def judged(dead: set[str], faults: dict[str, int], **fields: object) -> list[str]:
        ev = _evidence(key, item, dead_letters={key: dead}, **fields)
        ev.faults = Counter(faults)
        return sorted(v.rule for v in checker.judge(scenario, ev))

    bounded = {"queues_bound": 1}
    assert judged({"broker:expired"}, bounded) == []
    assert judged({"broker:maxlen"}, bounded) == []
    assert judged({"broker:expired"}, {}) == ["outcome"]  # no bound: not RabbitMQ's to drop
    assert judged({"broker:delivery_limit"}, bounded) == ["outcome"]  # RabbitMQ 4's limit
    assert judged(set(), bounded) == ["lost"]  # gone without a dead letter
    # the audit reads the trace only: there such a message has no end
    said_lost = Verdict({"lost": 1}, {"lost": [f"explore/{key}"]})
    assert judged({"broker:expired"}, bounded, audit=said_lost) == []
    assert judged(set(), bounded, audit=said_lost) == ["audit", "lost"]


def test_the_audits_verdict_on_a_message_id_is_judged_by_the_task_id_its_publish_named(
    tmp_path: Path,
):
    import json

    # a message is a publish: its id is not its task id; the trace's events name both
    line = {"ts_ms": 1, "event": "published", "message_id": "m-1", "queue": "explore",
            "task_id": "s1-0-x", "detail": {"confirmed": True}}  # fmt: skip
    (tmp_path / "p.jsonl").write_text(json.dumps(line) + "\n")
    item = Item(0, "work", "ok")
    key = "s1-0-x"
    scenario = _scenario(Settings(), item, Fault(1.0, "queues_bound", 0, 3.0, bound=200))
    said_lost = Verdict({"lost": 1}, {"lost": ["explore/m-1"]})
    ev = _evidence(key, item, dead_letters={key: {"broker:maxlen"}}, audit=said_lost)
    ev.trace = checker.read_trace(tmp_path)
    ev.faults = Counter({"queues_bound": 1})
    assert ev.trace.key_of("m-1") == key and ev.trace.key_of("other") == "other"
    assert checker.judge(scenario, ev) == []  # dead-lettered by RabbitMQ, not lost
    ev.dead_letters = {}
    violations = checker.judge(scenario, ev)
    assert sorted(v.rule for v in violations) == ["audit", "lost"]
    assert "(task s1-0-x)" in next(v.detail for v in violations if v.rule == "audit")


def test_a_surplus_copy_expired_beside_a_completed_one_is_no_second_outcome(tmp_path: Path):
    item = Item(0, "work", "ok")
    key = "s1-0-x"
    scenario = _scenario(Settings(), item, Fault(1.0, "queues_bound", 1, 3.0, bound=2))
    ev = _evidence(key, item, dead_letters={key: {"broker:maxlen"}})
    ev.trace.completed[key] = 1
    ev.faults = Counter({"queues_bound": 1})
    assert checker.judge(scenario, ev) == []
    ev.faults = Counter()
    assert [v.rule for v in checker.judge(scenario, ev)] == ["both", "outcome"]


def test_a_broker_dead_letter_reads_rabbitmqs_reason_when_the_worker_wrote_none():
    from celery_beetle.testing.explorer.runner import dead_reason

    assert dead_reason({"x-beetle-dead-reason": "not_retryable"}) == "not_retryable"
    assert dead_reason({"x-death": [{"reason": "expired", "queue": "q"}]}) == "broker:expired"
    assert dead_reason({"x-death": [{"reason": b"maxlen"}]}) == "broker:maxlen"
    assert dead_reason({}) == "None"


def test_the_fourth_version_draws_long_chains_and_retries_without_countdown_or_past_max():
    items = [i for seed in range(200) for i in draw(seed).items if _fourth(i)]
    chains = [i for i in items if i.kind == "chain"]
    assert chains and all(len(i.members) in (2, 3) for i in chains)
    assert {m for i in chains for m in (i.mode, *i.members)} == {"ok", "fatal"}
    assert any(i.retry_s == 0 and i.mode == "ok" for i in items if i.kind == "retry")
    assert {i.retries for i in items if i.mode == "past_max"} == {0, 1, 2}


# -- the draw's third version -----------------------------------------------------------------


def test_the_third_version_draws_each_feature_only_where_it_applies():
    scenarios = [draw(seed) for seed in range(400)]
    kinds = {i.kind for s in scenarios for i in s.items}
    assert {"retry", "group", "outbox", "scoped"} <= kinds
    faults = {f.kind for s in scenarios for f in s.faults}
    assert {"relay_kill", "broker_destroy", "queues_apply", "latency"} <= faults
    for s in scenarios:
        kinds_here = {f.kind for f in s.faults}
        if "broker_destroy" in kinds_here:
            assert s.settings.brokers == 3 and "migrate" not in kinds_here
        if "relay_kill" in kinds_here or any(i.kind == "outbox" for i in s.items):
            assert s.settings.outbox
        if any(i.kind == "scoped" for i in s.items):
            assert s.settings.shared_scope and "migrate" not in kinds_here
        assert all(0 < f.delay_ms <= 200 for f in s.faults if f.kind == "latency")
        assert len({i.index for i in s.items}) == len(s.items)
    assert any(i.ordering_key for s in scenarios for i in s.items if i.kind == "outbox")
    assert {i.mode for s in scenarios for i in s.items if i.kind == "outbox"} == {
        "commit",
        "rollback",
    }


def test_a_third_version_scenario_survives_its_json():
    seed = next(s for s in range(200) if any(i.kind == "group" for i in draw(s).items))
    assert Scenario.from_json(draw(seed).to_json()) == draw(seed)
    old = '{"seed": 1, "settings": {}, "items": [{"index": 0, "kind": "work"}], "faults": []}'
    assert Scenario.from_json(old).items[0].members == ()  # a regression test's JSON


def _judged(item: Item, ev: checker.Evidence, settings: Settings | None = None) -> list[str]:
    return sorted(v.rule for v in checker.judge(_scenario(settings or Settings(), item), ev))


def test_each_run_of_a_retrying_body_is_a_message_and_the_next_is_awaited():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "retry", retries=1, retry_s=0.5)
    first, second = checker.retry_key("k", 0), checker.retry_key("k", 1)
    assert (first, second) == ("k", "k:retry-1")
    ledger = Ledger(
        {
            first: Entry(starts=[(1.0, 5)], retried=[(1.1, 5)]),
            second: Entry(starts=[(2.0, 5)], ends=[(2.1, 5)]),
        }
    )
    ev = _evidence("k", item, ledger=ledger)
    ev.trace.completed[first] = 1
    assert checker.awaited({"k"}, {"k": item}, ev.trace) == {first, second}
    assert _judged(item, ev) == ["lost"]  # the retry it published never ended
    ev.trace.completed[second] = 1
    assert _judged(item, ev) == []
    ev.ledger[second] = Entry(starts=[(2.0, 5)], retried=[(2.1, 5)])
    assert _judged(item, ev) == ["retry"]  # it retried more often than it asks


def test_a_retrying_body_killed_before_its_retry_is_judged_alone():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "retry", retries=1)
    ledger = Ledger({"k": Entry(starts=[(1.0, 5)])})
    ev = _evidence("k", item, ledger=ledger, kills=[(1.5, {5})])
    ev.trace.dead["k"].append("attempts_limit")
    assert checker.awaited({"k"}, {"k": item}, ev.trace) == {"k"}
    assert _judged(item, ev) == []
    # its retry was published before the kill and ran: judged like any message
    ev.ledger["k:retry-1"] = Entry(starts=[(3.0, 6), (4.0, 6)], ends=[(4.1, 6)])
    ev.trace.completed["k:retry-1"] = 1
    assert _judged(item, ev) == ["starts"]


def test_each_link_of_a_long_chain_runs_once_after_the_one_before_and_never_after_a_failure():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "chain", "ok", members=("ok", "fatal", "ok"))
    links = [checker.link_key("k", n) for n in range(4)]
    assert links == ["k", "kc", "kc2", "kc3"] and checker.chain_modes(item)[2] == "fatal"
    ran = {link: Entry(starts=[(n, 5)], ends=[(n + 0.1, 5)]) for n, link in enumerate(links[:2])}
    ev = _evidence("k", item, ledger=Ledger(ran))
    ev.trace.completed.update({"k": 1, "kc": 1})
    assert checker.awaited({"k"}, {"k": item}, ev.trace) == {"k", "kc", "kc2"}
    assert _judged(item, ev) == ["lost"]  # the third link was published and never ended
    ev.ledger["kc2"] = Entry(starts=[(2.0, 5)])
    ev.trace.dead["kc2"].append("not_retryable")
    assert _judged(item, ev) == []  # it failed: the fourth never runs
    ev.ledger["kc3"] = Entry(starts=[(3.0, 5)], ends=[(3.1, 5)])
    assert _judged(item, ev) == ["chain"]  # ran after a failed link


def test_a_retry_past_max_retries_is_dead_lettered_as_not_worth_a_retry():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "retry", "past_max", retries=1, retry_s=0.0)
    first, last = checker.retry_key("k", 0), checker.retry_key("k", 1)
    ledger = Ledger(
        {
            first: Entry(starts=[(1.0, 5)], retried=[(1.1, 5)]),
            last: Entry(starts=[(2.0, 5)], fails=1),
        }
    )
    ev = _evidence("k", item, ledger=ledger)
    ev.trace.completed[first] = 1
    assert checker.awaited({"k"}, {"k": item}, ev.trace) == {first, last}
    ev.trace.dead[last].append("not_retryable")  # MaxRetriesExceededError
    assert _judged(item, ev) == []
    del ev.trace.dead[last]
    ev.trace.completed[last] = 1
    assert _judged(item, ev) == ["outcome"]  # Celery raised in the body: it cannot succeed


def test_a_chords_body_runs_once_after_its_whole_header_and_never_after_a_failure():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "chord", members=("ok", "ok"))
    header, body = ["kg0", "kg1"], checker.chord_body_key("k")
    ran = {m: Entry(starts=[(1.0, 5)], ends=[(1.1, 5)]) for m in header}
    ev = _evidence("k", item, ledger=Ledger(ran))
    ev.trace.completed.update(dict.fromkeys(header, 1))
    assert checker.awaited({"k"}, {"k": item}, ev.trace) == {*header, body}
    assert _judged(item, ev) == ["lost"]  # every header task completed: the body must run
    ev.faults["redis_kill"] = 1  # the result backend's Redis: the chord may have failed
    assert checker.awaited({"k"}, {"k": item}, ev.trace, chords_may_fail=True) == set(header)
    assert _judged(item, ev) == []
    ev.ledger[body] = Entry(starts=[(2.0, 5)], ends=[(2.1, 5)])
    ev.trace.completed[body] = 1
    assert _judged(item, ev) == []

    fatal = Item(0, "chord", members=("ok", "fatal"))
    ev = _evidence("k", fatal, ledger=Ledger({**ran, body: Entry(starts=[(2.0, 5)])}))
    ev.trace.completed["kg0"] = 1
    ev.trace.dead["kg1"].append("not_retryable")
    assert _judged(fatal, ev) == ["chord"]  # ran although its header failed


def test_chords_come_with_a_result_backend_in_a_quarter_of_the_scenarios():
    scenarios = [draw(seed) for seed in range(200)]
    with_chords = [s for s in scenarios if s.chords]
    assert 20 < len(with_chords) < 80
    sizes = {len(i.members) for s in with_chords for i in s.items if i.kind == "chord"}
    assert sizes == {2, 3, 4}


def test_the_trace_knows_a_retry_by_its_message_id(tmp_path: Path):
    import json

    lines = [
        {"ts_ms": 1, "event": "completed", "message_id": "k", "queue": "q", "task_id": "k"},
        {"ts_ms": 2, "event": "started", "message_id": "k:retry-1", "queue": "q", "task_id": "k"},
    ]
    (tmp_path / "w.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    trace = checker.read_trace(tmp_path)
    assert trace.completed == Counter({"k": 1})
    assert trace.started == Counter({"k:retry-1": 1})


def test_each_member_of_a_group_is_judged_as_the_body_it_names():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "group", members=("ok", "fatal"))
    ok, fatal = checker.member_key("k", 0), checker.member_key("k", 1)
    ledger = Ledger({ok: Entry(starts=[(1.0, 5)], ends=[(1.1, 5)]), fatal: Entry([(1.0, 6)])})
    ev = _evidence("k", item, ledger=ledger)
    assert checker.awaited({"k"}, {"k": item}, ev.trace) == {ok, fatal}
    ev.trace.dead[fatal].append("not_retryable")
    assert _judged(item, ev) == ["lost"]  # the ok member has no outcome
    ev.trace.completed[ok] = 1
    assert _judged(item, ev) == []
    ev.trace.completed[fatal] = 1
    assert "outcome" in _judged(item, ev)


def test_a_rolled_back_enqueue_never_runs_and_a_committed_one_runs_once():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    rolled = Item(0, "outbox", "rollback")
    ev = _evidence("k", rolled, confirmed=set(), rolled_back={"k"})
    assert _judged(rolled, ev) == []
    ev.ledger["k"] = Entry(starts=[(1.0, 5)])
    assert _judged(rolled, ev) == ["rolled_back_ran"]

    committed = Item(0, "outbox", "commit")
    assert allowed.expect(committed, Settings()).outcomes == {"completed"}
    ledger = Ledger({"k": Entry(starts=[(1.0, 5)], ends=[(1.1, 5)])})
    ev = _evidence("k", committed, ledger=ledger)
    assert _judged(committed, ev) == ["lost"]  # committed, never relayed or never run
    ev.trace.completed["k"] = 1
    assert _judged(committed, ev) == []


def test_a_message_in_two_queues_of_one_scope_runs_once():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "scoped")
    ledger = Ledger({"k": Entry(starts=[(1.0, 5), (1.0, 6)], ends=[(1.1, 5), (1.1, 6)])})
    ev = _evidence("k", item, ledger=ledger)
    ev.trace.completed["k"] = 1
    assert _judged(item, ev) == ["starts"]  # once per scope, not per queue
    ev.ledger["k"] = Entry(starts=[(1.0, 5)], ends=[(1.1, 5)])
    assert _judged(item, ev) == []


def test_a_destroyed_broker_may_take_single_copies_with_it_and_nothing_else():
    settings = Settings(brokers=3)
    on_node_1, on_node_2 = Item(1, "bad", "undecodable"), Item(2, "bad", "undecodable")
    for item, rules in ((on_node_1, []), (on_node_2, ["lost"])):
        ev = _evidence("k", item, destroyed={1})
        ev.faults["broker_destroy"] = 1
        assert _judged(item, ev, settings) == rules, item
    plain = Item(0, "plain")
    ev = _evidence("k", plain)
    ev.faults["broker_destroy"] = 1
    assert _judged(plain, ev, settings) == []
    ok = Item(0, "work", "ok")  # two copies on two brokers: never lost with one
    ev = _evidence("k", ok, destroyed={0})
    ev.faults["broker_destroy"] = 1
    assert _judged(ok, ev, settings) == ["lost"]


def test_latency_and_a_policy_apply_excuse_nothing():
    for fault in ("latency", "queues_apply", "relay_kill"):
        plain = Item(0, "plain")
        ev = _evidence("k", plain)
        ev.faults[fault] = 1
        assert _judged(plain, ev) == ["lost"], fault
        assert fault in allowed.THIRD_VERSION or fault == "relay_kill"
    assert {"retry", "rolled_back_ran"} <= set(allowed.RULES)


def test_a_keys_rows_are_published_in_the_order_of_their_ids(tmp_path: Path):
    import json

    rows = {"a1": Item(0, "outbox", "commit", ordering_key="k0"),
            "a2": Item(1, "outbox", "commit", ordering_key="k0"),
            "a3": Item(2, "outbox", "commit", ordering_key="k1")}  # fmt: skip

    def published(times: dict[str, int]) -> list[str]:
        lines = [
            {"ts_ms": ts, "event": "published", "message_id": mid, "queue": "q",
             "detail": {"confirmed": True}}
            for mid, ts in times.items()
        ] + [{"ts_ms": 1, "event": "published", "message_id": "a2", "queue": "q",
              "detail": {"confirmed": False}}]  # fmt: skip
        (tmp_path / "relay.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        ev = _evidence("a1", rows["a1"], confirmed=set(rows), keys=rows)
        ev.trace = checker.read_trace(tmp_path)
        for key in rows:
            ev.trace.completed[key] = 1
        return [v.rule for v in checker.judge(Scenario(1, Settings(), tuple(rows.values())), ev)]

    assert published({"a1": 10, "a2": 20, "a3": 5}) == []  # another key is not held back
    assert published({"a1": 20, "a2": 10, "a3": 30}) == ["order"]
    assert published({"a2": 10}) == []  # a row never published: judged as lost elsewhere


def test_a_solo_plain_task_killed_mid_body_may_run_again_and_only_then():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    plain = Item(0, "plain")

    def judged(pool: str, ends: list[tuple[float, int]]) -> list[str]:
        # started in 99, SIGKILLed at 11 s, started again in 100 and returned
        entry = Entry(starts=[(10.0, 99), (12.0, 100)], ends=[(12.5, 100), *ends])
        ev = _evidence("k", plain, ledger=Ledger({"k": entry}), kills=[(11.0, {99})])
        ev.faults["worker_kill"] = 1
        return _judged(plain, ev, Settings(pool=pool))

    # Celery's early ack waits on the loop, which the solo body holds: still unacked
    assert judged("solo", []) == []
    # elsewhere the ack went out as the body began; and a body that returned was acked
    assert judged("prefork", []) == ["plain_twice"]
    assert judged("solo", [(10.5, 99)]) == ["plain_twice"]


def test_a_plain_task_may_run_twice_only_where_a_lowered_consumer_timeout_gave_it_back():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    plain = Item(0, "plain")
    entry = Entry(starts=[(10.0, 99), (16.0, 100)], ends=[(10.5, 99), (16.5, 100)])

    def judged(consumer_timeout_ms: int) -> list[str]:
        ev = _evidence("k", plain, ledger=Ledger({"k": entry}))
        return _judged(plain, ev, Settings(consumer_timeout_ms=consumer_timeout_ms))

    assert judged(5_000) == []
    assert judged(0) == ["plain_twice"]  # the default (30 min) never closes a channel here


def test_the_sixth_version_keeps_every_seeds_fifth_version_scenario():
    """Pinned on the draw's fifth version (before the sixth was added): the whole scenario
    but the sixth version's settings and faults stays what it was."""
    import hashlib
    import json

    pinned = {
        1000: "468305a47407a571",
        1004: "00ae077642b0b9f7",
        3022: "d1b91c433345c99c",
        5000: "51dc87ddce7d21d4",
        5071: "a0656e5be3183aa7",
        90003: "3b2e95c17be21fe6",
        95162: "0cc11ba8c5155bf5",
    }

    def digest(scenario: Scenario) -> str:
        view = _before_sixth(scenario)
        return hashlib.sha256(json.dumps(view, sort_keys=True).encode()).hexdigest()[:16]

    assert {seed: digest(draw(seed)) for seed in pinned} == pinned


def test_the_sixth_version_draws_sentinel_failovers_untraced_workers_and_empty_nodes():
    scenarios = [draw(seed) for seed in range(400)]
    sentinel = [s for s in scenarios if s.settings.sentinel]
    assert 0.12 < len(sentinel) / len(scenarios) < 0.28
    assert {s.settings.wait_replicas for s in sentinel} == {0, 1}
    assert not any(s.settings.wait_replicas for s in scenarios if not s.settings.sentinel)
    failovers = [f for s in sentinel for f in s.faults if f.kind == "redis_failover"]
    assert len(failovers) > len(sentinel) / 2
    assert {f.lag_s for f in failovers} == {0.0, 0.5, 1.5}
    for s in scenarios:
        kinds = {f.kind for f in s.faults}
        if "redis_failover" in kinds or "replica_lag" in kinds:
            assert s.settings.sentinel
        if "replica_lag" in kinds:
            assert s.settings.wait_replicas
        if "broker_replace" in kinds:
            assert not kinds & {"migrate", "broker_destroy", "queues_bound"}
        if s.settings.untraced:
            assert s.settings.workers >= 2
        if s.settings.previous:
            assert s.settings.workers >= 2 and "worker_upgrade" in kinds
    assert any(s.settings.untraced for s in scenarios)
    assert any(s.settings.previous for s in scenarios)
    assert any(f.kind == "broker_replace" for s in scenarios for f in s.faults)


def test_a_failover_without_wait_replicas_may_run_a_message_it_touched_again_and_nothing_else():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "work", "ok")
    ledger = Ledger({"k": Entry(starts=[(10.0, 5), (14.0, 6)], ends=[(10.2, 5), (14.2, 6)])})

    def rules(failovers: list[tuple[float, float, bool]]) -> list[str]:
        ev = _evidence("k", item, ledger=ledger, failovers=failovers)
        ev.trace.completed["k"] = 2
        return [v.rule for v in checker.judge(_scenario(Settings(), item), ev)]

    assert rules([(10.5, 0.0, False)]) == []  # its completion was acknowledged unreplicated
    assert rules([(12.0, 1.5, False)]) == []  # the replica lagged 1.5 s before the kill
    assert rules([(10.5, 0.0, True)]) == ["starts", "ran_again"]  # wait_replicas: never
    assert rules([(30.0, 0.5, False)]) == ["starts", "ran_again"]  # long after: never


def test_with_tracing_off_a_message_is_completed_by_the_ledger_and_the_audit_not_asked(
    tmp_path: Path,
):
    note(str(tmp_path), "start", "k", untraced=True)
    note(str(tmp_path), "end", "k", untraced=True)
    ledger = read_dir(tmp_path)
    assert ledger.untraced_pids and checker.untraced_completions(ledger) == {"k"}
    (tmp_path / "trace").mkdir()
    trace = checker.read_trace(tmp_path / "trace", tmp_path)
    assert trace.is_completed("k")
    item = Item(0, "work", "ok")
    counts = {"messages": 2, "lost": 1, "duplicated": 0, "unexpected": 1}
    audit = Verdict(counts, {"lost": ["explore/k"], "unexpected": ["explore/kc"]})
    ev = _evidence("k", item, ledger=ledger, trace=trace, audit=audit)
    untraced = Scenario(1, Settings(workers=2, untraced=1), (item,), ())
    assert checker.judge(untraced, ev) == []
    traced = Scenario(1, Settings(workers=2), (item,), ())
    assert [v.rule for v in checker.judge(traced, ev)] == ["audit", "audit"]


def test_a_raw_message_on_a_broker_replaced_by_an_empty_node_may_be_gone():
    item = Item(0, "bad", "undecodable")
    ev = _evidence("k", item, replaced={0})
    assert checker.judge(_scenario(Settings(brokers=2), item), ev) == []
    ev = _evidence("k", item, replaced={1})
    assert [v.rule for v in checker.judge(_scenario(Settings(brokers=2), item), ev)] == ["lost"]
    plain = Item(0, "plain")
    ev = _evidence("k", plain)
    ev.faults["broker_replace"] = 1
    assert checker.judge(_scenario(Settings(), plain), ev) == []


def test_a_previous_release_that_is_not_a_commit_is_skipped_with_the_reason(tmp_path: Path):
    from celery_beetle.testing.explorer.previous import checkout

    root, said = checkout(tmp_path, "no-such-commit-here")
    assert root is None
    assert said.startswith("previous release 'no-such-commit-here' skipped: not a commit here")


def test_an_empty_node_that_never_got_the_runs_queues_again_is_a_violation():
    item = Item(0, "plain")
    ev = _evidence("k", item, missing_queues={"127.0.0.1:5": ["explore"]})
    ev.trace.completed["k"] = 1
    ev.faults["broker_replace"] = 1
    rules = [v.rule for v in checker.judge(_scenario(Settings(), item), ev)]
    assert rules == ["redeclared"]


def _early_ack_twin_rules(
    acks_late: bool | None = False,
    replaced_at: float | None = 5.0,
    delivered_from: tuple[str, ...] = ("a:1",),
    published_at: float = 1.0,
    left: bool = False,
    twin: bool = True,
) -> list[str]:
    """The rules a BeetleTask with no outcome breaks: copies on ``a:1`` and ``b:2`` (its
    twin), ``b:2`` replaced by an empty node at ``replaced_at``, a worker took a copy from
    ``delivered_from``."""
    item = Item(0, "work", "ok")
    audit = Verdict(
        {"messages": 1, "lost": 1, "duplicated": 0, "unexpected": 0}, {"lost": ["explore/k"]}
    )
    replacements = [] if replaced_at is None else [(replaced_at, "b:2")]
    leftover = {"a:1/explore": ["k"]} if left else {}
    ev = _evidence("k", item, audit=audit, replacements=replacements, leftover=leftover)
    ev.trace.copies["k"] += [(published_at, "a:1")] + ([(published_at, "b:2")] if twin else [])
    ev.trace.delivered_from["k"].update(delivered_from)
    scenario = _scenario(Settings(acks_late=acks_late, brokers=2), item)
    assert checker.early_ack_losses(scenario, ev) == ([] if checker.judge(scenario, ev) else ["k"])
    return sorted(v.rule for v in checker.judge(scenario, ev))


def test_early_acks_may_lose_a_taken_message_whose_twin_an_empty_broker_wiped_and_nothing_else():
    # acks_late=False, a copy taken on a:1 and cut short, its twin wiped with b:2: excused
    assert _early_ack_twin_rules() == []
    # the run may begin after the twin was wiped: two faults all the same
    assert _early_ack_twin_rules(replaced_at=0.5, published_at=0.1) == []
    # late acks (BeetleTask's default, or set): the taken copy goes back, so a loss is a loss
    assert _early_ack_twin_rules(acks_late=True) == ["audit", "lost"]
    assert _early_ack_twin_rules(acks_late=None) == ["audit", "lost"]
    # no broker replaced: the twin is there to run
    assert _early_ack_twin_rules(replaced_at=None) == ["audit", "lost"]
    # never taken by a worker, or taken only from the broker that was wiped: nothing excuses it
    assert _early_ack_twin_rules(delivered_from=()) == ["audit", "lost"]
    assert _early_ack_twin_rules(delivered_from=("b:2",)) == ["audit", "lost"]
    # the copy on b:2 was confirmed after the old node died: the empty node never held it
    assert _early_ack_twin_rules(published_at=6.0) == ["audit", "lost"]
    # a copy left in a queue was not taken: lost, and left over
    assert _early_ack_twin_rules(left=True) == ["audit", "leftover", "lost"]
    # a degraded publish (a broker down then) made no twin: the taken copy was the last
    assert _early_ack_twin_rules(replaced_at=None, twin=False) == []
    assert _early_ack_twin_rules(replaced_at=None, twin=False, acks_late=None) == [
        "audit",
        "lost",
    ]


def test_a_flaky_body_a_failover_ran_again_may_complete_though_its_first_run_failed():
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "work", "flaky")  # fails its first run, succeeds the next
    ledger = Ledger({"k": Entry(starts=[(10.0, 5), (14.0, 6)], ends=[(14.2, 6)])})

    def rules(failovers: list[tuple[float, float, bool]]) -> list[str]:
        ev = _evidence("k", item, ledger=ledger, failovers=failovers)
        ev.trace.completed["k"] = 1
        return sorted(v.rule for v in checker.judge(_scenario(Settings(), item), ev))

    assert rules([(10.5, 0.0, False)]) == []  # its failure was acknowledged unreplicated
    assert "outcome" in rules([(10.5, 0.0, True)])  # wait_replicas: the failure stands
    assert "outcome" in rules([])


def test_a_completion_a_failover_lost_may_leave_its_message_dead_lettered_attempts_limit():
    """Seed 111124: the body returned at 24.71 and its completion was acknowledged by the
    old master in the replica's lag before the kill (about 25.4); the promoted replica kept
    the start, not the completion, and at ``attempts=1`` the twin copy dead-lettered the
    message ``attempts_limit``. Allowed without ``wait_replicas``, as a re-run is."""
    from celery_beetle.testing.explorer.ledger import Entry, Ledger

    item = Item(0, "work", "long")
    ledger = Ledger({"k": Entry(starts=[(19.7, 5)], ends=[(24.71, 5)])})

    def rules(failovers: list[tuple[float, float, bool]]) -> list[str]:
        ev = _evidence("k", item, ledger=ledger, failovers=failovers)
        ev.trace.dead["k"].append("attempts_limit")
        return [v.rule for v in checker.judge(_scenario(Settings(attempts=1), item), ev)]

    assert rules([(25.4, 1.5, False)]) == []  # its completion was acknowledged unreplicated
    assert rules([(25.4, 1.5, True)]) == ["success_dead"]  # wait_replicas: never lost
    assert rules([(24.5, 1.5, False)]) == ["success_dead"]  # it ended after the kill
    assert rules([(30.0, 1.5, False)]) == ["success_dead"]  # replicated before the lag


def test_the_default_previous_release_is_never_older_than_the_floor(monkeypatch):
    from celery_beetle.testing.explorer import previous

    monkeypatch.delenv(previous.ENV, raising=False)
    try:
        floor = previous.commit_of(previous.FLOOR)[1]
    except Exception:
        pytest.skip("the floor is not in this history (a shallow clone)")
    monkeypatch.setattr(previous, "DEFAULT_REF", f"{previous.FLOOR}~1")
    assert previous.commit_of(None) == (previous.FLOOR[:7], floor)
    monkeypatch.setattr(previous, "DEFAULT_REF", "HEAD")
    head = previous.commit_of("HEAD")[1]
    assert previous.commit_of(None) == ("HEAD", head)
    # a release named is taken as it is, older than the floor or not
    older = previous.commit_of(f"{previous.FLOOR}~1")[1]
    assert previous.commit_of(f"{previous.FLOOR}~1") == (f"{previous.FLOOR}~1", older)
