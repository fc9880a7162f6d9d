"""Observability: usage and cost per call."""
