"""Servers the tests need beyond :mod:`celery_beetle.testing`: TLS.

:mod:`tests.harness.tls` makes a throwaway CA and runs RabbitMQ and Redis listening on TLS.
Every other helper (brokers, Redis, Sentinel, proxies, ports, waiting, workers) is imported
from :mod:`celery_beetle.testing`, the one path shared with the pytest plugin.
"""
