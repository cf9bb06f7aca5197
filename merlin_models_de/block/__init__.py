"""The input side: the ``DistributedEmbeddings`` layer (:mod:`.layer`), its per-table handles
(:mod:`.handles`), ``select_by_tag`` views (:mod:`.views`) and per-table regularization
(:mod:`.regularization`). Nothing here imports the output side or the Merlin hooks."""
