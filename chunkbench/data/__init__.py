"""Workload data shipped with the package (see ORIGIN.md)."""
