"""Servers the tests need beyond :mod:`celery_beetle.testing`: a Sentinel trio and TLS.

:mod:`tests.harness.sentinel` runs a Redis master, a replica and a Sentinel for failover tests.
:mod:`tests.harness.tls` makes a throwaway CA and runs RabbitMQ and Redis listening on TLS.
Every other helper (brokers, Redis, proxies, ports, waiting, workers) is imported from
:mod:`celery_beetle.testing`, the one path shared with the pytest plugin.
"""
