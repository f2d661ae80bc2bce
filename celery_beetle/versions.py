"""The oldest versions of its dependencies beetle runs on, checked when it is installed.

:data:`FLOORS` repeats the floors of ``install_requires`` in ``setup.cfg`` (a unit test holds
the two alike). A floor is what the code needs, and each is tested (the version matrix):

=========  ========  ================================================================
package    floor     why not older
=========  ========  ================================================================
celery     5.3.6     it carries ``replaced_task_nesting`` in the message, which names a
                     replacement of a replacement apart (``self.replace()`` twice)
kombu      5.3.4     what Celery 5.3.6 needs
amqp       5.1.1     what kombu 5.3.4 needs
redis      5.0       the Lua store's client; its Sentinel and Cluster clients
click      8.1.2     what Celery 5.3.6 needs
rich       13.0      the CLI's tables
=========  ========  ================================================================

:May import: nothing of the project
:Not imported by: ``kombu_beetle``, ``celery_beetle.store``, ``celery_beetle.worker``
"""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import metadata

__all__ = ["FLOORS", "below_floor", "parse_version"]

#: distribution name -> the oldest release beetle runs on
FLOORS: dict[str, tuple[int, ...]] = {
    "celery": (5, 3, 6),
    "kombu": (5, 3, 4),
    "amqp": (5, 1, 1),
    "redis": (5, 0),
    "click": (8, 1, 2),
    "rich": (13, 0),
}


def parse_version(text: str) -> tuple[int, ...]:
    """The release numbers at the start of a version string (``"5.3.0rc1"`` -> ``(5, 3, 0)``)."""
    match = re.match(r"\d+(?:\.\d+)*", text.strip())
    if not match:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(part) for part in match.group().split("."))


def below_floor(version_of: Callable[[str], str] | None = None) -> list[str]:
    """One line per installed dependency older than its floor (empty when all are recent)."""
    version_of = version_of or metadata.version
    found = []
    for name, floor in FLOORS.items():
        try:
            installed = version_of(name)
        except metadata.PackageNotFoundError:
            continue  # vendored or installed another way: its import says the rest
        if parse_version(installed) < floor:
            wanted = ".".join(map(str, floor))
            found.append(
                f"{name} {installed} is installed, beetle needs {name}>={wanted} "
                f"(pip install -U '{name}>={wanted}')"
            )
    return found
