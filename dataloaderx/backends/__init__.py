"""The prefetch backends, one module each, and their base class.

The registry lists the built-in ones by name and imports a backend's module when its
name is first used.
"""

from dataloaderx.contracts.backend import Backend, BatchStream

__all__ = ["Backend", "BatchStream"]
