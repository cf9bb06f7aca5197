"""Serving a trained model with Merlin Systems (one process, no Horovod): the NVTabular
workflow in front of the exported SavedModel (:mod:`.ensemble`), and retrieval through a
Faiss index filled in batches from a table the parallel table export wrote
(:mod:`.faiss_index`, :mod:`.retrieval`). Needs the ``serving`` extra."""
