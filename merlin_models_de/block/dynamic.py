"""The block's dynamic tables (:mod:`merlin_models_de.dynamic`): the option read back from a
config, the backend that runs them, and what they hold, read from every rank.

Example:
    >>> keys, rows = block.dynamic_table("item_id")  # collective  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Mapping

from merlin_models_de.dynamic import contents as dynamic_contents
from merlin_models_de.tables import DynamicTable


class DynamicTablesMixin:
    """The block's reads and writes of its dynamic tables (every method but
    :attr:`key_features` is collective)."""

    @property
    def key_features(self) -> frozenset:
        """The features of dynamic tables: their ids are 64-bit keys."""
        return frozenset(f.name for t in self.tables if t.dynamic is not None for f in t.features)

    def dynamic_table(self, table: str):
        """Collective: ``(keys, rows)`` of dynamic ``table`` (a feature or table name), every
        key that has a row, sorted by key, on every rank."""
        self.ensure_built()
        keymap, var = self._dynamic_parts(table)
        return dynamic_contents.gathered(keymap, var)

    def dynamic_counters(self) -> dict:
        """Collective: ``{table: {"keys", "admitted", "evicted"}}`` of the dynamic tables,
        summed over ranks (keys: how many hold a row now)."""
        self.ensure_built()
        return {
            t.name: dynamic_contents.counters(self._dynamic_parts(t.name)[0])
            for t in self.tables
            if t.dynamic is not None
        }

    def dynamic_summary(self) -> str:
        """One line per dynamic table with this rank's share of its counters (not collective:
        :meth:`dynamic_counters` sums them over ranks); empty without dynamic tables or before
        the block is built."""
        keymaps = getattr(self.backend, "keymaps", {}) if self.built else {}
        lines = []
        for table, keymap in keymaps.items():
            mine = dynamic_contents.local_counters(keymap)
            lines.append(
                f"dynamic table '{table}' on this rank: {mine['keys']:,} keys with a row "
                f"of {keymap.table.rows:,}, {mine['admitted']:,} admitted, "
                f"{mine['evicted']:,} evicted (dynamic_counters() sums every rank)"
            )
        return "\n".join(lines)

    def dynamic_maps(self) -> dict:
        """Collective: ``{table: whole map}`` of the dynamic tables, every rank's slots in row
        order (what :meth:`set_dynamic_maps` of a one-process copy takes)."""
        self.ensure_built()
        return {
            table: dynamic_contents.whole_map(keymap, self.backend.defaults[table])
            for table, keymap in getattr(self.backend, "keymaps", {}).items()
        }

    def set_dynamic_maps(self, maps: dict) -> None:
        """Sets the dynamic tables' maps from :meth:`dynamic_maps` (one process: the export's
        copy, whose rows :meth:`set_global_weights` wrote in the same order)."""
        self.ensure_built()
        for table, whole in maps.items():
            keymap, _ = self._dynamic_parts(table)
            dynamic_contents.load_whole_map(keymap, self.backend.defaults[table], whole)

    def _dynamic_parts(self, name: str):
        table = next(
            (t.name for t in self.tables if name == t.name or name in {f.name for f in t.features}),
            name,
        )
        keymaps = getattr(self.backend, "keymaps", {})
        if table not in keymaps:
            dynamic = [t.name for t in self.tables if t.dynamic is not None]
            raise ValueError(
                f"'{name}' is not a dynamic table of block '{self.name}' (dynamic: {dynamic}). "
                f"Received: table={name!r}"
            )
        return keymaps[table], self.backend.rw[table]


def dynamic_options(value) -> dict:
    """``dynamic`` as ``{name: DynamicTable}`` (a config's plain dicts read back)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(
            "dynamic_tables must be a dict {feature or table: DynamicTable(capacity=...)}. "
            f"Received: dynamic_tables={value!r}"
        )
    return {
        name: DynamicTable(**option) if isinstance(option, Mapping) else option
        for name, option in value.items()
    }


def backend_for_dynamic(backend: str, tables) -> str:
    """``auto`` runs dynamic tables on the built-in backend; another backend refuses them."""
    dynamic = [t.name for t in tables if t.dynamic is not None]
    if not dynamic or backend == "horovod":
        return backend
    if backend == "auto":
        return "horovod"
    raise NotImplementedError(
        f"Dynamic tables {dynamic} run on backend='horovod' (or 'auto') only. "
        f"Received: backend={backend!r}"
    )
