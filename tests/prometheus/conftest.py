"""The exactly-once tests' worker and publisher fixtures, for the dashboard's real run."""

from tests.exactly_once.conftest import client, eo_worker  # noqa: F401
