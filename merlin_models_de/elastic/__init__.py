"""Elastic training of sharded models (Horovod elastic, Gloo): ``ShardedState`` and ``run``."""
