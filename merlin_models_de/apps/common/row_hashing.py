"""Refusing to train on columns NVTabular 23.08 hashed together with the row's index.

On CPU NVTabular 23.08 hashes with pandas' ``hash_pandas_object``, index included:
``HashBucket`` and ``Categorify(num_buckets=k)``'s out-of-vocabulary buckets give one value a
different id in every row, so a model trained on such a column learns noise. The parquet
does not show it, but the schema NVTabular writes next to it does, and keeps it through
``Groupby``, ``Rename``, ``ListSlice`` and the tagging operators:

- ``Categorify(num_buckets=k)``: the column's property ``num_buckets`` is ``k``;
- ``HashBucket(k)``: the property ``embedding_sizes`` (cardinality ``k``) without
  ``Categorify``'s ``cat_path``;
- the value-only operators of :mod:`merlin_models_de.serving.hashing` write the same
  properties as the operators they replace, plus :data:`VALUE_ONLY`.

cuDF hashes the value only, so data NVTabular transformed on GPU is accepted with
``--hashed-on-gpu`` (the schema does not record the device).
"""

from __future__ import annotations

# the column property serving/hashing.py's operators add: ids that hash the value only
VALUE_ONLY = "hashes_value_only"
INSTEAD = {"HashBucket": "ValueHashBucket", "Categorify": "ValueCategorify"}


def add_hashing_option(group) -> None:
    """``--hashed-on-gpu``, in ``group`` (the command's data options)."""
    group.add_argument(
        "--hashed-on-gpu",
        action="store_true",
        help="the parquet was transformed by NVTabular on GPU, which hashes the value "
        "only: accept columns of HashBucket and Categorify(num_buckets=...)",
    )


def row_hashed_columns(schema, names=None) -> list[tuple[str, str]]:
    """``[(column, operator)]``: the columns of ``schema`` (those in ``names``, default all)
    that NVTabular's ``HashBucket`` or ``Categorify(num_buckets=...)`` wrote."""
    found = []
    for column in schema:
        props = column.properties
        if (names is not None and column.name not in names) or props.get(VALUE_ONLY):
            continue
        if props.get("num_buckets"):
            found.append((column.name, f"Categorify(num_buckets={int(props['num_buckets'])})"))
        elif "embedding_sizes" in props and "cat_path" not in props:
            buckets = int(props["embedding_sizes"].get("cardinality", 0))
            found.append((column.name, f"HashBucket({buckets})"))
    return sorted(found)


def row_hashing_problem(args, names=None) -> str | None:
    """The problem when ``--train-dir`` or ``--valid-dir`` holds a column of ``names``
    (default all) that NVTabular hashed with the row's index, as one line; or None. Reads
    the schemas (which loads TensorFlow: call after the checks of the options)."""
    if args.hashed_on_gpu:
        return None
    from merlin_models_de.apps.common.schemas import load_schema

    for flag, path in (("--train-dir", args.train_dir), ("--valid-dir", args.valid_dir)):
        try:
            found = row_hashed_columns(load_schema(path), names) if path else []
        except ValueError as err:  # names the schema file
            return str(err)
        if found:
            named = ", ".join(f"{name!r} ({op})" for name, op in found)
            fix = " and ".join(
                f"{INSTEAD[op]} instead of {op}"
                for op in sorted({op.split("(")[0] for _, op in found})
            )
            return (
                f"{flag} has columns NVTabular hashed on CPU with the row's index: {named}; "
                "the same value has a different id in every row (the model would learn "
                f"noise). Fit the workflow with merlin_models_de.serving.hashing's {fix} "
                "and transform again (data transformed on GPU: --hashed-on-gpu). "
                f"Received: {flag}={path!r}"
            )
    return None
