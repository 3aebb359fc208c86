"""Built-in prefetch backends; importing this package registers them."""

from dataloaderx.backends import background, sync, thread
from dataloaderx.backends.base import Backend, BatchStream

__all__ = ["Backend", "BatchStream", "background", "sync", "thread"]
