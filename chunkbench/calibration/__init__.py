"""Fits on this machine or from profiles: GPU kernel constants (sim/calibration.json), step-cost profiles
(`chunkbench profile`), and the attention kernels' benchmark (`chunkbench kernels bench`)."""
