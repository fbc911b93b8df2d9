"""Audits, kernel-log watchers and fabric probes."""
