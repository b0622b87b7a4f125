"""The simulator: cost models, calibration against GPU profiles, deployments (TP, long context)."""
