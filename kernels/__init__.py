"""Paged-attention kernels (Triton, for CUDA) and their torch references (the CPU path and test oracle)."""
