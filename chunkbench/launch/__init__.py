"""Servers a tune launches: command templates, slots, ports, the process guard, GPU figures."""
