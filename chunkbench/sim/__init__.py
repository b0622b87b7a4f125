"""The simulator: the real scheduler on a virtual clock, with step times from a cost model (a GPU roofline or
a profile fitted to measured steps). See docs/architecture.md."""
