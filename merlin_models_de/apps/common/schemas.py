"""Loading a Merlin schema from a file, a dataset directory or a synthetic dataset name.

Every failure is a ``ValueError`` whose one-line message names the file, directory or name.

Example:
    >>> schema = load_schema("criteo")  # doctest: +SKIP
    >>> schema = load_schema("/data/train")  # doctest: +SKIP
"""

from __future__ import annotations

import ast
import importlib.util
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
    """A Merlin Schema from a schema file, a dataset directory, or a synthetic dataset name.

    Raises:
        ValueError: naming ``source`` (or the schema file in it) when it cannot be read or
            parsed, holds no columns, or is neither a path nor a synthetic dataset name.
    """
    if os.path.isfile(source):
        return _read_schema_file(source)
    if os.path.isdir(source):
        found = schema_file_in(source)
        if found is None:
            raise ValueError(
                f"Directory has no Merlin schema ({' or '.join(SCHEMA_FILES)}). "
                f"Received: schema={source!r}"
            )
        return _read_schema_file(found)
    return synthetic_schema(source)


def _read_schema_file(path: str):
    from merlin.schema.io.tensorflow_metadata import TensorflowMetadata

    folder, name = os.path.split(os.path.abspath(path))
    try:
        if name.endswith(".json"):
            schema = TensorflowMetadata.from_json_file(folder, name).to_merlin_schema()
        else:
            schema = TensorflowMetadata.from_proto_text_file(folder, name).to_merlin_schema()
    except Exception as err:  # protobuf, JSON, I/O and decoding errors alike: name the file
        reason = " ".join(str(err).split()) or type(err).__name__
        raise ValueError(
            f"Cannot read the Merlin schema file ({reason}). Received: schema={path!r}"
        ) from err
    if len(schema) == 0:
        raise ValueError(f"The Merlin schema file has no columns. Received: schema={path!r}")
    return schema


def synthetic_dataset_names() -> tuple[str, ...] | None:
    """Names of Merlin's synthetic datasets, read from the installed Merlin Models source.

    Reads ``KNOWN_DATASETS`` in ``merlin/datasets/synthetic.py`` without importing it (its
    import loads TensorFlow), so commands can check a name in milliseconds. None when the
    file is missing or no longer has that literal dict (then only the import can tell).
    """
    try:
        spec = importlib.util.find_spec("merlin.datasets.synthetic")
        with open(spec.origin, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (ImportError, AttributeError, TypeError, OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if getattr(target, "id", None) == "KNOWN_DATASETS" and isinstance(node.value, ast.Dict):
            keys = [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
            return tuple(sorted(keys)) if keys else None
    return None


def check_synthetic_name(name: str) -> None:
    """Raises ValueError naming ``name`` when it is not a known synthetic dataset.

    Cheap (no TensorFlow); when the names cannot be read, the check is left to the import.
    """
    names = synthetic_dataset_names()
    if names is not None and name not in names:
        raise ValueError(
            f"Not a schema file, a dataset directory or a synthetic dataset name "
            f"({list(names)}). Received: schema={name!r}"
        )


def synthetic_schema(name: str):
    """The schema of one of Merlin's synthetic datasets, e.g. ``criteo``."""
    check_synthetic_name(name)
    from merlin.datasets import synthetic

    if name not in synthetic.KNOWN_DATASETS:
        raise ValueError(
            f"Not a schema file, a dataset directory or a synthetic dataset name "
            f"({sorted(synthetic.KNOWN_DATASETS)}). Received: schema={name!r}"
        )
    return synthetic.generate_data(name, 1).schema
