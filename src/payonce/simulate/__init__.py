"""Simulate: what a timeout and retry configuration costs, without a network."""
