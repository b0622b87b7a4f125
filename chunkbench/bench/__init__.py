"""The measuring harness: a workload run on an engine (harness.py) or over HTTP (client.py), the metrics and
steady windows of a run, capacity searches over load, and the reports."""
