"""The next-item command: ``python -m merlin_models_de.apps.next_item`` (``__main__``), its
``run``, its synthetic sessions (``data``) and its ``elastic`` run."""
