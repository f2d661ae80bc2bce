"""``python -m celery_beetle.testing.explorer``: see :mod:`.cli`."""

from __future__ import annotations

import sys

from celery_beetle.testing.explorer.cli import main

sys.exit(main())
