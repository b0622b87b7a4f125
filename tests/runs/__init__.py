"""Runs: metrics, the metric table, workloads, compare and policy specs."""
