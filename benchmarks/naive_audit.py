"""The baseline audit, now :mod:`celery_beetle.audit.naive` (the plugin's small-trace checker).

Kept so ``python -m benchmarks.naive_audit TRACE...`` and old imports still work.
"""

from __future__ import annotations

import sys

from celery_beetle.audit.naive import Msg, Verdict, audit, expand, judge, main, verdict

__all__ = ["Msg", "Verdict", "audit", "expand", "judge", "main", "verdict"]

if __name__ == "__main__":
    sys.exit(main())
