"""Fits: the GPU kernel constants to operator profiles, the simulator to a launched server, step-cost profiles."""
