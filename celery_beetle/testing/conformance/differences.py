"""The tests of Celery's suites that fail under beetle for a reason of their own, not ours.

Each is named as :func:`~.results.read_junit` names it, with why it fails: the features
guide ("Conformance with Celery's own suites") says the same. A test that fails only under
beetle and is not here is a defect of ours, or one nobody has explained yet.
"""

from __future__ import annotations

__all__ = ["DIFFERENCES"]

_SAME_ID = (
    "it applies one frozen signature twice, so the second publish has the task id (the "
    "dedup identity) of a message that already ran: beetle drops it as a duplicate, as it "
    "drops a caller's republish of the same task id"
)

DIFFERENCES: dict[str, str] = {
    "test_tasks::test_task_replacement::test_replaced_task_nesting_level_0": (
        "a race in the test: it resets its flag after delay() returns, and a publish that "
        "waits for its confirms returns after the worker already received the task and set "
        "the flag; over pyamqp:// with confirm_publish it fails the same way"
    ),
    "test_canvas::test_chain::test_chord_header_id_duplicated_on_rabbitmq_msg_duplication"
    "[redis-group-ids]": (
        "the test publishes a task's message twice and expects it to run twice; beetle "
        "runs a duplicated message once, which is what it is for"
    ),
    "test_canvas::test_chord::test_reapplying_frozen_chord_dispatches_body_again": _SAME_ID,
    **{
        f"test_canvas::test_chord::test_mutable_errback_called_by_chord_from_{where}[{style}]": (
            _SAME_ID
        )
        for where in ("chain", "chain_tail", "group")
        for style in ("errback_old_style", "errback_new_style")
    },
}
