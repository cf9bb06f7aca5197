"""Run-time agreement between ranks: every rank fails together, in the graph and on the host
(:mod:`.agree`)."""
