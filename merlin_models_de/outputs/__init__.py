"""The output side over a block's tables: weight-tied outputs (:mod:`.tied`), their per-item
bias (:mod:`.bias`), the vocab-parallel softmax and top-k (:mod:`.vocab_parallel`), sharded
top-k for retrieval (:mod:`.topk`) and in-batch negatives from every rank (:mod:`.samplers`).
Outputs bind the table handle object they are given (``block["item_id"]``)."""
