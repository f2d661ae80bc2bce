"""The module paths that moved into the wings, kept for one release.

``celery_beetle.gate`` is now :mod:`celery_beetle.worker.gate`, ``celery_beetle.outcome``
:mod:`celery_beetle.store.outcome`, and so on (:data:`MOVED`); two names left a module that
stayed (:data:`MOVED_NAMES`: ``celery_beetle.metrics.OutboxCollector`` is now
:class:`celery_beetle.outbox.metrics.OutboxCollector`). An old path still imports,
with a :class:`DeprecationWarning` that names the new one, and gives the new module itself:
``celery_beetle.run.HandBack is celery_beetle.worker.run.HandBack``, so a result, a pickle or
a bootstep that names a class by its old path still finds it, and a test that patches the
old module patches the one the worker runs.

No file is left at the old paths (the folder shows the wings, and a change to an old file
follows it to its new place in a merge): :func:`install`, called by ``celery_beetle``'s
``__init__``, puts a finder for them first on :data:`sys.meta_path` (it answers for the
names of :data:`MOVED` only, so an old file left behind by an earlier install is never
loaded beside its new module). The old paths go in :data:`REMOVED_IN`, as the CHANGELOG says.

:May import: nothing of the project (an old path's module is imported by name, when asked)
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "MOVED_NAMES", "REMOVED_IN", "install", "names_moved_from"]

#: the release without the old paths
REMOVED_IN = "0.2.0"

#: old module path -> where it is now
MOVED: Mapping[str, str] = {
    "celery_beetle.bad_input": "celery_beetle.worker.bad_input",
    "celery_beetle.bootstep": "celery_beetle.worker.bootstep",
    "celery_beetle.deadletter": "celery_beetle.worker.deadletter",
    "celery_beetle.facts": "celery_beetle.worker.facts",
    "celery_beetle.gate": "celery_beetle.worker.gate",
    "celery_beetle.gate_reads": "celery_beetle.worker.gate_reads",
    "celery_beetle.handback": "celery_beetle.worker.handback",
    "celery_beetle.lease": "celery_beetle.worker.lease",
    "celery_beetle.quorum": "celery_beetle.worker.quorum",
    "celery_beetle.retry_queue": "celery_beetle.worker.retry_queue",
    "celery_beetle.run": "celery_beetle.worker.run",
    "celery_beetle.backoff": "celery_beetle.store.backoff",
    "celery_beetle.fake_store": "celery_beetle.store.fake",
    "celery_beetle.keys": "celery_beetle.store.keys",
    "celery_beetle.outcome": "celery_beetle.store.outcome",
    "celery_beetle.redis_health": "celery_beetle.store.health",
    "celery_beetle.state": "celery_beetle.store.state",
    "celery_beetle.status": "celery_beetle.cli.report",
    "celery_beetle.top": "celery_beetle.cli.top",
}


#: (module, name) -> the module the name moved to, out of a module that stayed
MOVED_NAMES: Mapping[tuple[str, str], str] = {
    ("celery_beetle.metrics", "GateCollector"): "celery_beetle.worker.metrics",
    ("celery_beetle.metrics", "OutboxCollector"): "celery_beetle.outbox.metrics",
}


def names_moved_from(module: str) -> Callable[[str], Any]:
    """``module``'s ``__getattr__`` for the names of :data:`MOVED_NAMES` that left it: each
    warns, then is read from where it went (imported only then)."""

    def __getattr__(name: str) -> Any:
        new = MOVED_NAMES.get((module, name))
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} moved to {new}.{name}: import it from there "
            f"({module}.{name} goes in {REMOVED_IN})",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new), name)

    return __getattr__


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path of :data:`MOVED` and loads it as the module it moved to."""

    def __init__(self) -> None:
        #: the new module's own spec, while the import system holds the old path's
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}: import it from there ({spec.name} goes in {REMOVED_IN})",
            DeprecationWarning,
            stacklevel=2,  # past the import machinery's frames: the import statement
        )
        # the new module itself, under both names; the import system sets what a module
        # lacks, and its __spec__, which exec_module gives back
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the new module ran when it was imported): give it back its own
        ``__spec__``, which the import system replaced with the old path's."""
        old = module.__spec__.name if module.__spec__ is not None else ""
        if old in self._specs:
            module.__spec__ = self._specs.pop(old)


_finder = _MovedModules()


def install() -> None:
    """Let the old paths import (once per process)."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
