"""The minimal serving engine: config, requests, paged KV blocks, scheduler, engine loop, executors.

Importing this package does not import torch; only the model executor does.
"""
