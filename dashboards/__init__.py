"""Grafana dashboards as code."""
