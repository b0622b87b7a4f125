"""Where a benchmark's steps run: the engine on this machine, the simulator, a running endpoint, a server launched per
configuration (each implements bench/backend.py's `Backend`), and the choice among them."""
