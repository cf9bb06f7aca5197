"""Tools, each ``python -m merlin_models_de.apps.tools.<name>``: ``plan`` (a placement plan
and the smallest world it fits), ``link_probe`` (a link's latency and bandwidth for the cost
model), ``hosts_check`` (every host answers ssh), ``launch`` (horovodrun, its servers bound to
one interface)."""
