"""``python -m celery_beetle.testing.conformance``: see :mod:`.cli`."""

from __future__ import annotations

import sys

from celery_beetle.testing.conformance.cli import main

sys.exit(main())
