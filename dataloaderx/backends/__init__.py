"""Built-in prefetch backends; importing this package registers them, in this order."""

from dataloaderx.backends import background, sync, thread

# isort: split
from dataloaderx.backends import cuda

# isort: split
from dataloaderx.backends import auto
from dataloaderx.backends.base import Backend, BatchStream

__all__ = ["Backend", "BatchStream", "auto", "background", "cuda", "sync", "thread"]
