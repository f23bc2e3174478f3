"""Evaluation: out-of-distribution loss and bits per byte per domain, and the task suites."""
