"""One epoch: the iterator ``iter(loader)`` returns, and the state it owns."""
