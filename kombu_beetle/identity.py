"""How a beetle connection names itself to a broker: AMQP client properties.

Every connection the transport opens announces ``product: kombu-beetle`` and the package's
version in its AMQP client properties, which the management API shows for each connection
(``GET /api/connections``). ``beetle fleet`` reads them to tell beetle consumers from plain
pyamqp ones (``product: py-amqp``) and older beetle versions from current ones, before a
deploy sends redundant copies to a queue that a plain consumer would run twice.

Properties a user passes (``client_properties`` in the transport options) are kept; ours
win only for the keys below.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

__all__ = ["PRODUCT", "VERSION_PROPERTY", "client_properties", "package_version"]

PRODUCT = "kombu-beetle"
#: the client property holding the transport's version (``product`` holds PRODUCT)
VERSION_PROPERTY = "beetle_version"


@cache
def package_version() -> str:
    """The installed kombu-beetle version ("0+unknown" when run from a bare source tree)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kombu-beetle")
    except PackageNotFoundError:
        return "0+unknown"


def client_properties(given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``given`` with the product and version of this transport set."""
    return {
        **dict(given or {}),
        "product": PRODUCT,
        "version": package_version(),
        VERSION_PROPERTY: package_version(),
    }
