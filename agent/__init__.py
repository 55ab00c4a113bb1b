"""GPU Bank node agent.

A standalone program: standard library plus ``httpx`` (and ``pynvml`` when real GPUs are present).
It must never import Django or anything from the service, because it ships to GPU nodes on its own.
"""

__version__ = "0.1.0"
