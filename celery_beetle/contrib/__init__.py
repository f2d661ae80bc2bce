"""Integrations with other frameworks (each an optional extra)."""
