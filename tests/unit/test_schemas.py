"""Loading a Merlin schema (apps/common/schemas.py): from a file, a dataset directory, or a synthetic
dataset's name; every failure one ValueError naming the file, directory or name."""

import pytest
from merlin.schema import ColumnSchema, Schema, Tags
from merlin.schema.io.tensorflow_metadata import TensorflowMetadata

from merlin_models_de.apps.common.schemas import (
    check_synthetic_name,
    load_schema,
    synthetic_dataset_names,
)

SCHEMA = Schema([ColumnSchema("user", dtype="int64", tags=[Tags.CATEGORICAL])])


def _write(directory):
    TensorflowMetadata.from_merlin_schema(SCHEMA).to_proto_text_file(str(directory))
    return directory / "schema.pbtxt"


def test_a_schema_file_or_its_dataset_directory(tmp_path):
    path = _write(tmp_path)
    assert load_schema(str(path)).column_names == ["user"]
    assert load_schema(str(tmp_path)).column_names == ["user"]


def test_each_failure_names_what_it_received(tmp_path):
    with pytest.raises(ValueError, match=f"no Merlin schema.*schema={str(tmp_path)!r}"):
        load_schema(str(tmp_path))
    broken = tmp_path / "schema.pbtxt"
    broken.write_text("feature { name: ")
    with pytest.raises(ValueError, match=f"Cannot read.*schema={str(broken)!r}"):
        load_schema(str(broken))
    broken.write_text("")
    with pytest.raises(ValueError, match="has no columns"):
        load_schema(str(broken))


def test_synthetic_names_are_checked_without_importing_them():
    names = synthetic_dataset_names()
    assert names and "criteo" in names
    check_synthetic_name("criteo")
    with pytest.raises(ValueError, match="Received: schema='critoe'"):
        check_synthetic_name("critoe")
