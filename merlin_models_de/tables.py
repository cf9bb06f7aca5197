"""Merlin schema -> embedding table specs (pure Python, no TensorFlow).

A table has ``rows = int_domain.max + 1`` rows. Features whose ``int_domain.name`` is the
same share one table, as ``mm.Embeddings`` does. List (multi-hot / ragged) features get a
combiner; scalar features are one-hot lookups.

Example:
    >>> from merlin.datasets.synthetic import generate_data  # doctest: +SKIP
    >>> schema = generate_data("music-streaming", 10).schema  # doctest: +SKIP
    >>> tables = tables_from_schema(schema, dim=16)  # doctest: +SKIP
    >>> [t.name for t in tables if len(t.features) > 1]  # doctest: +SKIP
    ['genres']
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Mapping, Sequence

COMBINERS = ("sum", "mean", "sqrtn")
EVICTION_POLICIES = ("lfu", "lru", "ttl", None)


@dataclass(frozen=True)
class DynamicTable:
    """A table whose ids are 64-bit keys that get rows as they arrive (``merlin_models_de.dynamic``).

    Attributes:
        capacity: Rows of the table over all ranks (each rank holds its share).
        admit_after: Sightings a key needs before it gets a row (1: at once); until then it
            reads the table's shared default row.
        evict: When a rank's share is full: ``"lfu"`` (least frequently used), ``"lru"``
            (least recently used), ``"ttl"`` (not used for ``ttl`` steps), or None (never:
            newcomers read the default row until a row is free).
        ttl: Steps without a use after which a row may be taken (``evict="ttl"`` only).
        candidates: Keys seen fewer than ``admit_after`` times that a rank remembers (the
            least recently seen is forgotten first); None: as many as its rows.

    Example:
        >>> DynamicTable(capacity=1000, admit_after=2).evict
        'lfu'
    """

    capacity: int
    admit_after: int = 1
    evict: str | None = "lfu"
    ttl: int | None = None
    candidates: int | None = None

    def __post_init__(self):
        for what, value in (("capacity", self.capacity), ("admit_after", self.admit_after)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"DynamicTable needs {what} to be an int >= 1. Received: {what}={value!r}"
                )
        if self.evict not in EVICTION_POLICIES:
            raise ValueError(
                f"DynamicTable's evict must be one of {list(EVICTION_POLICIES)}. "
                f"Received: evict={self.evict!r}"
            )
        for what, value in (("ttl", self.ttl), ("candidates", self.candidates)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(
                    f"DynamicTable's {what} must be None or an int >= 1. "
                    f"Received: {what}={value!r}"
                )
        if (self.evict == "ttl") != (self.ttl is not None):
            raise ValueError(
                "DynamicTable takes ttl with evict='ttl' and only then. "
                f"Received: evict={self.evict!r}, ttl={self.ttl!r}"
            )


@dataclass(frozen=True)
class FeatureSpec:
    """One input feature and how it is looked up.

    Attributes:
        name: Column name in the schema and key in the batch dict.
        table: Name of the table the feature reads.
        multi_hot: True for list / ragged features (several ids per sample).
        combiner: ``"sum"``, ``"mean"`` or ``"sqrtn"`` for pooled multi-hot lookups; ``None``
            for one-hot features, and for multi-hot features returned un-pooled (3-D).
        hotness: Ids per sample the schema declares for a multi-hot feature
            (:func:`declared_hotness`); None where it declares none. The planner's estimates
            read it (``planner/hotness.py``), so the block and the plan command place alike.

    Example:
        >>> FeatureSpec("genres", "genres", multi_hot=True, combiner="mean").combiner
        'mean'
    """

    name: str
    table: str
    multi_hot: bool = False
    combiner: str | None = None
    hotness: float | None = None


@dataclass(frozen=True)
class TableSpec:
    """One embedding table.

    Attributes:
        name: Table name (``int_domain.name`` or the column name).
        rows: Number of rows (vocabulary size).
        dim: Embedding width.
        features: The features that read this table, in schema order.
        dynamic: For a table whose ids are keys that get rows as they arrive, its options
            (``rows`` is then its capacity); None for a table of ``rows`` fixed ids.

    Example:
        >>> t = TableSpec("item", rows=1000, dim=16, features=(FeatureSpec("item", "item"),))
        >>> t.elements, t.bytes()
        (16000, 64000)
    """

    name: str
    rows: int
    dim: int
    features: tuple[FeatureSpec, ...]
    dynamic: DynamicTable | None = None

    def __post_init__(self):
        # a table of no rows or columns would be planned into shards of no (or negative) rows
        for what, value in (("rows", self.rows), ("dim", self.dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"Table '{self.name}' needs {what} to be an int >= 1. "
                    f"Received: {what}={value!r}"
                )

    @property
    def elements(self) -> int:
        """Number of parameters of the table."""
        return self.rows * self.dim

    def bytes(self, dtype_bytes: int = 4) -> int:
        """Parameter bytes of the table."""
        return self.elements * dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict; inverse of :meth:`from_dict`. A feature's ``hotness``
        is written only where its schema declared one, so the manifests of models without
        one stay as installs before the field read them."""
        out = asdict(self)
        if out["dynamic"] is None:  # fixed tables' manifests stay as they were
            del out["dynamic"]
        for feature in out["features"]:
            if feature["hotness"] is None:
                del feature["hotness"]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TableSpec":
        """Builds a TableSpec from :meth:`to_dict` output (keys a later version adds to a
        feature are left out)."""
        known = {f.name for f in fields(FeatureSpec)}
        feats = tuple(
            FeatureSpec(**{k: v for k, v in f.items() if k in known}) for f in data["features"]
        )
        dynamic = DynamicTable(**data["dynamic"]) if data.get("dynamic") else None
        return cls(data["name"], int(data["rows"]), int(data["dim"]), feats, dynamic)


def default_infer_dim(column) -> int:
    """Merlin's embedding-dim heuristic (``infer_embedding_dim``), imported lazily."""
    from merlin.models.utils.schema_utils import infer_embedding_dim

    return int(infer_embedding_dim(column))


def embedding_columns(schema) -> list:
    """The columns that get embedding tables.

    ``mm.Embeddings`` embeds every column it is given, and Merlin's models give it
    ``schema.select_by_tag(Tags.CATEGORICAL)``. So: when the schema tags columns CATEGORICAL,
    those (minus TARGET-tagged ones) are embedded, and the block takes a model's full schema
    (whose untagged integer columns can be labels, as aliccp's ``click``); when it tags none,
    every column is embedded as ``mm.Embeddings`` would, except TARGET-tagged ones and
    CONTINUOUS-tagged ones (the model's other inputs).

    Example:
        >>> cols = embedding_columns(schema)  # doctest: +SKIP
    """
    from merlin.schema import Tags

    columns = [col for col in schema if Tags.TARGET not in col.tags]
    categorical = [col for col in columns if Tags.CATEGORICAL in col.tags]
    if categorical:
        return categorical
    return [col for col in columns if Tags.CONTINUOUS not in col.tags]


def _dtype_name(column) -> str:
    element = getattr(column.dtype, "element_type", None)
    return getattr(element, "value", str(column.dtype))


def declared_hotness(column) -> tuple[float | None, str | None]:
    """``(ids per sample, which bound)`` a list column's schema declares: its
    ``value_count``'s max, else its min (a lower bound); ``(None, None)`` without one.

    Example:
        >>> from merlin.schema import ColumnSchema
        >>> genres = ColumnSchema("genres", is_list=True, properties={"value_count": {"max": 5}})
        >>> declared_hotness(genres)
        (5.0, 'max')
    """
    count = getattr(column, "value_count", None)
    for end in ("max", "min"):
        value = getattr(count, end, None) if count is not None else None
        if value:
            return float(value), end
    return None, None


def _rows_of(column, dynamic: DynamicTable | None = None) -> int:
    if dynamic is not None:  # keys get rows as they arrive: no vocabulary to count
        return dynamic.capacity
    from merlin.schema import Tags

    kind = "Categorical column" if Tags.CATEGORICAL in column.tags else "Column"
    domain = column.int_domain
    if domain is None or domain.max is None:
        dtype = _dtype_name(column)
        # raw ids (strings, or integers nobody counted) need a dictionary first
        fix = (
            "encode it with NVTabular's Categorify (nvt.ops.Categorify), which maps the "
            "values to contiguous integer ids and writes the int_domain"
            if dtype in ("string", "str", "object") or Tags.CATEGORICAL in column.tags
            else "tag it CONTINUOUS or leave it out of the schema given to the embeddings"
        )
        raise ValueError(
            f"{kind} '{column.name}' has no cardinality, so it cannot be embedded: its schema "
            f"needs an integer dtype and an int_domain with a max (rows = max + 1); {fix}. "
            f"Received: dtype={dtype!r}, int_domain={domain!r}"
        )
    if int(domain.max) <= 0:
        raise ValueError(
            f"{kind} '{column.name}' needs int_domain.max > 0. "
            f"Received: int_domain.max={domain.max!r}"
        )
    return int(domain.max) + 1


def _check_keys(option: str, value: Any, known: set[str]) -> None:
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(
                f"{option} names features or tables that are not in the schema: {unknown}. "
                f"Known: {sorted(known)}"
            )


def _dim_of(column, table: str, dim, infer_dim_fn: Callable) -> int:
    value = None
    if isinstance(dim, Mapping):
        value = dim.get(column.name, dim.get(table))
    elif dim is not None:
        value = dim
    if value is None:
        value = infer_dim_fn(column)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"dim for feature '{column.name}' must be a positive int. Received: dim={value!r}"
        )
    return value


def is_layer_combiner(value) -> bool:
    """A Keras layer given as ``sequence_combiner``: applied to the un-pooled rows."""
    return value is not None and not isinstance(value, str) and callable(value)


def _combiner_of(column, combiner, first: str) -> str | None:
    """A dict is read at the table's ``first`` feature: ``mm.Embeddings`` gives a table the
    options of the column that created it, for every feature that shares it."""
    multi_hot = bool(column.is_list or column.is_ragged)
    if not multi_hot:
        return None
    value = combiner.get(first) if isinstance(combiner, Mapping) else combiner
    if is_layer_combiner(value):
        return None  # looked up un-pooled; the block applies the layer (as mm.Embeddings)
    if value is not None and value not in COMBINERS:
        raise ValueError(
            f"Unknown combiner for feature '{column.name}'; expected one of {COMBINERS} or "
            f"None. Received: combiner={value!r}"
        )
    return value


def tables_from_schema(
    schema,
    dim: int | Mapping[str, int] | None = None,
    *,
    infer_dim_fn: Callable | None = None,
    combiner: str | Mapping[str, str | None] | None = "mean",
    dynamic: Mapping[str, DynamicTable] | None = None,
) -> tuple[TableSpec, ...]:
    """Builds the table specs of the columns ``mm.Embeddings`` embeds (see
    :func:`embedding_columns`).

    Args:
        schema: A Merlin ``Schema``.
        dim: One width for all tables, a dict by feature or table name, or None to infer it.
        infer_dim_fn: ``column -> int`` used where ``dim`` gives none; Merlin's
            ``infer_embedding_dim`` by default.
        combiner: Pooling of list features (``sum``, ``mean``, ``sqrtn`` or None for un-pooled
            3-D outputs), one for all or a dict by feature name (a shared table's features
            all take its first feature's, as in ``mm.Embeddings``); a Keras layer counts as
            None here (the block applies it to the un-pooled rows).
        dynamic: ``{feature or table: DynamicTable}``: tables whose ids are 64-bit keys that
            get rows as they arrive; their rows are the capacity, and their columns need an
            integer dtype but no cardinality.

    Returns:
        The tables in schema order of their first feature.

    Raises:
        ValueError: naming the column and value, for missing or non-positive cardinality,
            shared tables that disagree on rows or dim, unknown combiners, or dicts that
            name features not in the schema.

    Example:
        >>> tables = tables_from_schema(schema, dim={"item_id": 32}, combiner="sum")  # doctest: +SKIP
    """
    infer_dim_fn = infer_dim_fn or default_infer_dim
    columns = embedding_columns(schema)
    if not columns:
        raise ValueError(
            "The schema has no categorical, non-target columns to embed (columns tagged TARGET, "
            "or CONTINUOUS without CATEGORICAL, are skipped). "
            f"Received columns: {list(schema.column_names)}"
        )
    names = {c.name for c in columns}
    table_names = {_table_of(c) for c in columns}
    _check_keys("dynamic_tables", dynamic, names | table_names)
    dynamic_of = _dynamic_options(columns, dynamic or {})
    for col in columns:
        _rows_of(col, dynamic_of.get(_table_of(col)))  # a column without a domain fails first
    _check_keys("dim", dim, names | table_names)
    _check_keys("combiner", combiner, names)

    rows: dict[str, int] = {}
    dims: dict[str, int] = {}
    feats: dict[str, list[FeatureSpec]] = {}
    first: dict[str, str] = {}
    for col in columns:
        table = _table_of(col)
        n_rows = _rows_of(col, dynamic_of.get(table))
        width = _dim_of(col, table, dim, infer_dim_fn)
        if table in rows:
            for what, mine, theirs in (("rows", n_rows, rows[table]), ("dim", width, dims[table])):
                if mine != theirs:
                    raise ValueError(
                        f"Features '{first[table]}' and '{col.name}' share table '{table}' "
                        f"but disagree on {what}: {theirs} != {mine}. "
                        f"Received: {what}={mine!r} for '{col.name}'"
                    )
        else:
            rows[table], dims[table], feats[table], first[table] = n_rows, width, [], col.name
        multi = bool(col.is_list or col.is_ragged)
        feats[table].append(
            FeatureSpec(
                col.name,
                table,
                multi,
                _combiner_of(col, combiner, first[table]),
                hotness=declared_hotness(col)[0] if multi else None,
            )
        )
    for t in dynamic_of:
        if len(feats[t]) > 1:  # one key map update per step and table (dynamic/keymap.py)
            raise NotImplementedError(
                f"A dynamic table is read by one feature; table '{t}' is shared by "
                f"{[f.name for f in feats[t]]}. Received: dynamic_tables naming '{t}'"
            )
    return tuple(TableSpec(t, rows[t], dims[t], tuple(feats[t]), dynamic_of.get(t)) for t in rows)


def _table_of(column) -> str:
    domain = column.int_domain
    return (domain.name if domain is not None else None) or column.name


def _dynamic_options(columns, dynamic: Mapping[str, Any]) -> dict[str, DynamicTable]:
    """``{table: DynamicTable}`` of ``dynamic`` (keyed by feature or table name); a dynamic
    table's columns must hold integers (raw ids or 64-bit hashes of the values)."""
    out: dict[str, DynamicTable] = {}
    for col in columns:
        table = _table_of(col)
        option = dynamic.get(col.name, dynamic.get(table))
        if option is None:
            continue
        if not isinstance(option, DynamicTable):
            raise ValueError(
                f"dynamic_tables['{col.name}'] must be a DynamicTable. Received: {option!r}"
            )
        dtype = _dtype_name(col)
        if not dtype.startswith(("int", "uint")) and dtype not in ("None", "unknown"):
            raise ValueError(
                f"Dynamic feature '{col.name}' must hold integer keys (raw ids, or 64-bit "
                f"hashes of the values); hash string ids first (docs/dynamic.md). "
                f"Received: dtype={dtype!r}"
            )
        out[table] = option
    return out


def feature_order(tables: Sequence[TableSpec]) -> list[FeatureSpec]:
    """All features of ``tables``, in table order then feature order (the input list order)."""
    return [f for t in tables for f in t.features]


def human_bytes(n: float) -> str:
    """``1536 -> '1.5 KiB'``."""
    if n < 1024:
        return f"{int(n)} B"
    exp = min(int(math.log(n, 1024)), 5)
    return f"{n / 1024 ** exp:.1f} {'KMGTP'[exp - 1]}iB"


# the dtypes a table may be stored in (the block's table_dtype; see merlin_models_de.kernels.rounding)
TABLE_DTYPES = ("float32", "float16", "bfloat16")


def narrow_table_bytes(table_dtype: str | None) -> int | None:
    """Bytes of a stored parameter under a 16-bit ``table_dtype`` (2), else None: the
    tables take their block's dtype, as the optimizer state does."""
    return 2 if table_dtype in ("float16", "bfloat16") else None


def table_dtype_name(value) -> str | None:
    """``value`` (None, a name or a ``tf.DType``) as a name from TABLE_DTYPES, or None.

    Raises ValueError naming the option and the value received.
    """
    if value is None:
        return None
    name = getattr(value, "name", value)
    if not isinstance(name, str) or name not in TABLE_DTYPES:
        raise ValueError(
            f"table_dtype must be None (tables are stored in the block's dtype) or one of "
            f"{list(TABLE_DTYPES)}. Received: table_dtype={value!r}"
        )
    return name
