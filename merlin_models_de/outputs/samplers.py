"""In-batch negatives drawn from the global batch of all ranks.

Merlin's ``"in-batch"`` sampler (``InBatchSamplerV2``) uses the other positives of the same
batch as negatives. Under horovodrun each rank sees only its own batch, so N ranks with batch
B train against B negatives per query, where one process with batch N*B uses N*B: the
losses differ. :class:`GlobalInBatchSampler` gathers every rank's positives (ids and
embeddings; the gather is differentiable) so that each query scores all N*B positives, as one
process does: losses and gradients equal one process on the global batch. With a tied item
table (``ContrastiveOutput(to_call=block["item_id"])``) the output re-looks the gathered ids
up through the block's distributed lookup, so table gradients go to the rows' owners.

Default: Merlin's local sampler stays what ``"in-batch"`` means (data-parallel Merlin under
Horovod does the same, and it needs no extra communication); pass
``negative_samplers=GlobalInBatchSampler()`` for the global batch's negatives. It costs one
allgather of ``[B, dim]`` embeddings and ``[B]`` ids per step.

Example:
    >>> output = mm.ContrastiveOutput(to_call=block["item_id"],
    ...                               negative_samplers=GlobalInBatchSampler())  # doctest: +SKIP
"""

from __future__ import annotations

import tensorflow as tf
from merlin.models.tf.outputs.sampling.base import Candidate
from merlin.models.tf.outputs.sampling.in_batch import InBatchSamplerV2

from merlin_models_de import comm


class GatheredCandidates(Candidate):
    """Candidates gathered from every rank: never equal to the local positives. (Merlin's
    ContrastiveOutput compares the negatives with the positives to decide whether to look
    their embeddings up; comparing tensors in a graph is not allowed, and the gathered ids
    are a different, larger set anyway.)"""

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    __hash__ = object.__hash__


@tf.keras.utils.register_keras_serializable(package="merlin_models_de")
class GlobalInBatchSampler(InBatchSamplerV2):
    """The positives of every rank's batch, in rank order, as negatives (collective)."""

    def call(
        self, items: Candidate, features=None, targets=None, training=False, testing=False
    ) -> Candidate:
        del features, targets, training, testing
        ids = comm.allgather(items.id, name=f"mmde_{self.name}_ids")
        metadata = {}
        if items.has_embedding:  # ordered after the ids on every rank (see comm.after)
            metadata["__embedding__"] = comm.allgather(
                comm.after(items.embedding, ids), name=f"mmde_{self.name}_embeddings"
            )
        self.add(GatheredCandidates(id=ids, metadata=metadata))
        return self.sample()


__all__ = ["GlobalInBatchSampler"]
