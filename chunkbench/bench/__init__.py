"""Workloads, the clients and harness that run them, and the metrics and reports of a run."""
