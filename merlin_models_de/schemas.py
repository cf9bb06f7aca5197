"""Loading a Merlin schema from a file, a dataset directory or a synthetic dataset name.

Example:
    >>> schema = load_schema("criteo")  # doctest: +SKIP
    >>> schema = load_schema("/data/train")  # doctest: +SKIP
"""
from __future__ import annotations

import os

# Where a dataset directory keeps its schema (NVTabular writes one of these), in lookup order.
SCHEMA_FILES = ("schema.pbtxt", ".merlin/schema.json", "schema.json")


def schema_file_in(directory: str) -> str | None:
    """The schema file inside ``directory``, or None."""
    for rel in SCHEMA_FILES:
        path = os.path.join(directory, rel)
        if os.path.isfile(path):
            return path
    return None


def load_schema(source: str):
    """A Merlin Schema from a schema file, a dataset directory, or a synthetic dataset name."""
    from merlin.schema.io.tensorflow_metadata import TensorflowMetadata

    if os.path.isfile(source):
        folder, name = os.path.split(os.path.abspath(source))
        if name.endswith(".json"):
            return TensorflowMetadata.from_json_file(folder, name).to_merlin_schema()
        return TensorflowMetadata.from_proto_text_file(folder, name).to_merlin_schema()
    if os.path.isdir(source):
        found = schema_file_in(source)
        if found is None:
            raise ValueError(f"Directory has no Merlin schema ({' or '.join(SCHEMA_FILES)}). "
                             f"Received: schema={source!r}")
        return load_schema(found)
    return synthetic_schema(source)


def synthetic_schema(name: str):
    """The schema of one of Merlin's synthetic datasets, e.g. ``criteo``."""
    from merlin.datasets import synthetic

    if name not in synthetic.KNOWN_DATASETS:
        raise ValueError(f"Not a schema file, a dataset directory or a synthetic dataset name "
                         f"({sorted(synthetic.KNOWN_DATASETS)}). Received: schema={name!r}")
    return synthetic.generate_data(name, 1).schema
