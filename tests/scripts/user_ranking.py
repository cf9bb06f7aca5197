"""A user's own ranking script, as docs/training.md shows it: Merlin's DLRM over
``mm.DistributedEmbeddings``, this rank's batches as ``loader_dataset``; fit one epoch,
evaluate, predict. Run by tests/commands/test_user_script_output.py under horovodrun."""

import merlin.models.tf as mm
from merlin.datasets.synthetic import generate_data
from merlin.schema import Tags

import merlin_models_de

train, valid = generate_data("e-commerce", 2_000, set_sizes=(0.8, 0.2))
train, valid = train.repartition(npartitions=2), valid.repartition(npartitions=2)
schema = train.schema.excluding_by_name(["conversion"])
model = mm.DLRMModel(
    schema,
    embeddings=mm.DistributedEmbeddings(schema.select_by_tag(Tags.CATEGORICAL), dim=8),
    bottom_block=mm.MLPBlock([8]),
    top_block=mm.MLPBlock([8]),
    prediction_tasks=mm.BinaryClassificationTask("click"),
)
model.compile(optimizer="adam")
model.fit(merlin_models_de.loader_dataset(train, 128), epochs=1, verbose=2)
model.evaluate(merlin_models_de.loader_dataset(valid, 128), verbose=0)
model.predict(merlin_models_de.loader_dataset(valid, 128), verbose=0)
print("done")
