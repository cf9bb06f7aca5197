"""Damaged or odd checkpoint files are named, never misread: a bit flip in a ``.npy``
header is a StorageError naming the file from every reader; bfloat16 tables read back as
bfloat16 from every reader; a ``latest`` that is a directory names the intact checkpoint."""

import os
import re
import shutil

import numpy as np
import pytest

from merlin_models_de.persistence.checkpoint import (
    latest_checkpoint,
    read_full_tables,
    restore_checkpoint,
    save_checkpoint,
)
from merlin_models_de.persistence.io import StorageError, check_array
from merlin_models_de.persistence.table_export import export_table, iter_table, read_table
from tests.unit import checkpoint_helpers as ch
from tests.unit.checkpoint_helpers import saved_checkpoint  # noqa: F401  (the `saved` fixture)


def _first_shard(root):
    return os.path.join(
        root, [f for f in ch.files_under(root) if os.path.basename(f).startswith("table-")][0]
    )


def _flip_header_brace(path):
    """Flips one bit of the header's closing ``}`` (into ``|``): NumPy's tokenizer then
    meets the end of the header inside an open brace."""
    with open(path, "r+b") as f:
        head = f.read(256)
        at = head.index(b"}")
        f.seek(at)
        f.write(bytes([head[at] ^ 0x01]))


def test_every_bit_flip_in_a_header_is_a_storage_error_naming_the_file(saved):
    directory, _ = saved
    path = _first_shard(latest_checkpoint(directory))
    data = np.load(path)
    with open(path, "rb") as f:
        original = f.read()
    header = original.index(b"\n") + 1  # magic, length and the header's text
    for at in range(header):
        for bit in range(8):
            damaged = bytearray(original)
            damaged[at] ^= 1 << bit
            with open(path, "wb") as f:
                f.write(damaged)
            try:
                check_array(path, data.shape, data.dtype)  # a flip in padding may read the same
            except StorageError as exc:
                assert path in str(exc), (at, bit, str(exc))


def test_a_flipped_header_is_named_by_restore_and_read_full_tables(saved):
    directory, _ = saved
    path = _first_shard(latest_checkpoint(directory))
    _flip_header_brace(path)
    named = rf"File {re.escape(path)} is not a readable \.npy array: TokenError"
    with pytest.raises(StorageError, match=named):
        read_full_tables(latest_checkpoint(directory))
    with pytest.raises(StorageError, match=named):
        restore_checkpoint(ch.build(ch.legacy_adagrad, seed=3), directory)


def test_a_flipped_header_is_named_by_read_table_and_iter_table(saved, tmp_path):
    _, model = saved
    export = str(tmp_path / "export")
    export_table(model.emb, "a", export)
    path = os.path.join(export, "part-00000.npy")
    _flip_header_brace(path)
    named = rf"File {re.escape(path)} is not a readable \.npy array: TokenError"
    with pytest.raises(StorageError, match=named):
        read_table(export)
    with pytest.raises(StorageError, match=named):
        next(iter_table(export))


def test_read_full_tables_returns_bfloat16_tables_as_bfloat16(tmp_path):
    from merlin_models_de import DistributedEmbeddings

    block = DistributedEmbeddings(ch.schema(), dim=4, table_dtype="bfloat16")
    block.ensure_built()
    directory = str(tmp_path / "ckpt")
    save_checkpoint(block, directory, step=1)
    tables = read_full_tables(latest_checkpoint(directory))[block.name]
    weights = block.get_global_weights()
    assert sorted(tables) == sorted(weights)
    for name, parts in tables.items():
        assert str(parts["table"].dtype) == "bfloat16", name
        np.testing.assert_array_equal(
            np.asarray(parts["table"], np.float32), np.asarray(weights[name], np.float32)
        )
    export_table(block, "a", str(tmp_path / "a"))  # the table export agrees
    assert read_table(str(tmp_path / "a")).dtype == parts["table"].dtype


def test_latest_that_is_a_directory_names_the_intact_checkpoint(saved):
    directory, model = saved
    intact = latest_checkpoint(directory)
    pointer = os.path.join(directory, "latest")
    os.remove(pointer)
    os.mkdir(pointer)
    named = (
        rf"pointer {re.escape(pointer)} is a directory, not a file naming a checkpoint.*"
        rf"newest intact checkpoint is {re.escape(intact)} \(step 4\).*"
        rf"`rm -r {re.escape(pointer)} && echo ckpt-000000004 > {re.escape(pointer)}`.*"
        rf"Received: latest='a directory'"
    )
    with pytest.raises(StorageError, match=named):
        latest_checkpoint(directory)
    with pytest.raises(StorageError, match=named):
        restore_checkpoint(ch.build(ch.legacy_adagrad, seed=3), directory)
    # a save is refused before it writes anything (not after its rename, pointing nowhere)
    with pytest.raises(StorageError, match=rf"{re.escape(pointer)} is a directory.*Remove it"):
        save_checkpoint(model, directory, step=5)
    assert sorted(os.listdir(directory)) == ["ckpt-000000004", "latest"]
    shutil.rmtree(pointer)  # as the error says
    with open(pointer, "w", encoding="utf-8") as f:
        f.write("ckpt-000000004\n")
    assert restore_checkpoint(ch.build(ch.legacy_adagrad, seed=3), directory)["step"] == 4
