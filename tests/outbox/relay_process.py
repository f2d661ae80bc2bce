"""``beetle relay`` in a subprocess, optionally killing itself with SIGKILL right after a
batch was published and before its rows are deleted (``BEETLE_RELAY_CRASH`` = the chance
per batch): the one window in which a relay leaves rows it already published.
"""

from __future__ import annotations

import os
import random
import signal
import sys

from celery_beetle.outbox import relay


def _install_crash(chance: float) -> None:
    original = relay._flush_traces

    def flush_then_maybe_die() -> None:
        original()
        if random.random() < chance:
            os.kill(os.getpid(), signal.SIGKILL)

    relay._flush_traces = flush_then_maybe_die


if __name__ == "__main__":
    chance = float(os.environ.get("BEETLE_RELAY_CRASH", "0"))
    if chance:
        _install_crash(chance)
    from celery_beetle.cli import main

    main(["relay", *sys.argv[1:]], prog_name="beetle")
