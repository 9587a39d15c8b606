"""Diagnostics outside the request path: a GC census, a stack sampler, per-thread CPU time. Each is off unless
its environment variable (flashstate/envs.py) or a test turns it on."""
