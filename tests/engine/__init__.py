"""The engine: same tokens under every policy and knob, scheduler properties, prefix caching, kernels."""
