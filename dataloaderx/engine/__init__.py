"""The producer and decision machinery the prefetching backends share.

A producer thread (:mod:`~dataloaderx.engine.producer`) fills a bounded buffer
(:mod:`~dataloaderx.engine.channel`) that the loop reads through a stream
(:mod:`~dataloaderx.engine.stream`); :mod:`~dataloaderx.engine.decision` decides, from
measured cycles, whether such a producer pays.
"""
