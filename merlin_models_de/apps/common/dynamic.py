"""The commands' dynamic-table options: ``--dynamic FEATURE[=CAPACITY]`` and its policy."""

from __future__ import annotations

import argparse

from merlin_models_de.tables import EVICTION_POLICIES, DynamicTable

POLICIES = [p for p in EVICTION_POLICIES if p is not None] + ["never"]


def add_dynamic_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--dynamic",
        action="append",
        default=[],
        metavar="FEATURE[=CAPACITY]",
        help="a table whose ids are keys that get rows as they arrive (docs/dynamic.md); "
        "CAPACITY: its rows over all ranks (default: the schema's cardinality); repeatable",
    )
    group.add_argument("--admit-after", type=int, default=1, help="sightings before a row")
    group.add_argument("--evict", default="lfu", choices=POLICIES, help="when a share is full")
    group.add_argument("--ttl", type=int, default=None, help="steps, with --evict ttl")


def _parsed(args) -> list[tuple[str, int | None]]:
    out = []
    for item in args.dynamic:
        name, _, capacity = item.partition("=")
        out.append((name, int(capacity) if capacity else None))
    return out


def dynamic_problem(args) -> str | None:
    """The first problem with the dynamic-table options, or None (the same on every rank)."""
    try:
        tables = _parsed(args)
    except ValueError:
        return f"--dynamic takes FEATURE or FEATURE=CAPACITY. Received: --dynamic {args.dynamic}"
    if not tables:
        return None
    try:
        _option(args, 1)
    except ValueError as err:
        return f"--dynamic: {err}"
    return None


def _option(args, capacity: int) -> DynamicTable:
    evict = None if args.evict == "never" else args.evict
    return DynamicTable(capacity, args.admit_after, evict, args.ttl)


def dynamic_tables(args, schema) -> dict:
    """``{feature: DynamicTable}`` of the options; a capacity left out is the column's
    cardinality (the rows the fixed table would have)."""
    out = {}
    for name, capacity in _parsed(args):
        if name not in schema.column_names:
            raise ValueError(
                f"--dynamic names a column that is not in the schema. Received: --dynamic "
                f"{name}; columns: {sorted(schema.column_names)}"
            )
        if capacity is None:
            domain = schema[name].int_domain
            if domain is None or domain.max is None:
                raise ValueError(f"--dynamic {name} needs =CAPACITY: its column has no cardinality")
            capacity = int(domain.max) + 1
        out[name] = _option(args, capacity)
    return out


def counters_text(tables: dict) -> str:
    """The epoch line's part for ``{table: {"keys", "admitted", "evicted"}}`` (a report's
    ``dynamic_tables``): `` TABLE: N keys (A admitted, E evicted)`` each; empty without."""
    return "".join(
        f" {table}: {c['keys']:,} keys ({c['admitted']:,} admitted, {c['evicted']:,} evicted)"
        for table, c in tables.items()
    )
