"""Built-in prefetch backends; importing this package registers them."""

from dataloaderx.backends import auto, background, cuda, sync, thread
from dataloaderx.backends.base import Backend, BatchStream

__all__ = ["Backend", "BatchStream", "auto", "background", "cuda", "sync", "thread"]
