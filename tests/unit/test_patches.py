"""Every patch of Keras, Merlin Models, Horovod and TensorFlow is declared in one registry and
made through it; docs/training.md lists the registry; and outside the package's own models
none is felt: models without the block train bit for bit as without the package."""

import ast
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import merlin_models_de
from merlin_models_de import compat
from merlin_models_de.compat import registry

ROOT = pathlib.Path(merlin_models_de.__file__).parent
DOCS = ROOT.parent / "docs" / "training.md"
BEGIN, END = (
    "<!-- patches: merlin_models_de.compat.patches_markdown() -->\n",
    "<!-- end of patches -->",
)
# what goes in once Merlin Models is imported (after import merlin_models_de)
EAGER = (registry.AT_IMPORT, registry.AT_MERLIN_IMPORT)


def listed_in_docs() -> str:
    text = DOCS.read_text()
    assert BEGIN in text and END in text, f"{DOCS.name} lost its list of patches"
    return text.split(BEGIN, 1)[1].split(END, 1)[0]


def test_the_docs_list_every_patch_of_the_registry_and_a_built_model_made_only_those(
    synthetic_schema,
):
    import merlin.models.tf as mm
    from merlin.schema import Tags

    schema = synthetic_schema("criteo")
    model = mm.DLRMModel(
        schema,
        embeddings=mm.DistributedEmbeddings(schema, dim=4),
        bottom_block=mm.MLPBlock([4]),
        prediction_tasks=mm.BinaryOutput(schema.select_by_tag(Tags.TARGET).column_names[0]),
    )
    model.compile("sgd")

    declared = compat.patches()
    assert listed_in_docs() == compat.patches_markdown()
    targets = {p.target for p in declared}
    in_place = set(registry.installed())
    assert in_place <= targets
    # every process-wide patch that goes in with Merlin is in place: none made behind the
    # registry's back, none declared and forgotten
    assert {p.target for p in declared if p.when in EAGER} <= in_place


def test_the_docs_check_sees_a_patch_missing_from_the_list():
    listed = listed_in_docs()
    first = listed.splitlines(keepends=True)[0]
    assert listed.replace(first, "") != compat.patches_markdown()


def test_replace_refuses_an_undeclared_patch_and_another_owner():
    class Owner:
        def method(self):
            return "original"

    stray = registry.Patch(
        f"{__name__}.Owner.method", "c", "w", ("keras 2.12",), registry.PROCESS, "now"
    )
    with pytest.raises(ValueError, match="undeclared patch.*Owner.method"):
        registry.replace(stray, Owner, lambda original: original)
    keras_compile = next(p for p in compat.patches() if p.target.endswith("Model.compile"))
    with pytest.raises(ValueError, match=r"another owner. Received: .*Owner.compile"):
        registry.replace(keras_compile, Owner, lambda original: original)
    assert Owner().method() == "original"


def assigned_attributes(tree):
    """``(line, attribute)`` of every ``x.attribute = ...`` and ``setattr(x, "attribute", ...)``."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Attribute) and isinstance(leaf.ctx, ast.Store):
                        yield node.lineno, leaf.attr
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "setattr"
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
        ):
            yield node.lineno, node.args[1].value


def test_no_module_sets_a_patched_attribute_behind_the_registry():
    names = {p.attribute for p in compat.patches()}
    offenders = []
    for path in ROOT.rglob("*.py"):
        if path.name == "registry.py" and path.parent.name == "compat":
            continue
        for line, name in assigned_attributes(ast.parse(path.read_text())):
            if name in names:
                offenders.append(f"{path.relative_to(ROOT)}:{line} sets {name}")
    assert offenders == []


def test_the_registry_check_finds_an_assignment():
    tree = ast.parse("import keras\nkeras.Model.compile = print\nsetattr(x, '_allreduce', f)")
    assert sorted(n for _, n in assigned_attributes(tree)) == ["_allreduce", "compile"]


def train_without_the_block(outs):
    """Runs the two sides (``{with_package: out}``) at once, each in its own process; returns
    their saved weights in the same order."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONWARNINGS="ignore")
    started = []
    for with_package, out in outs.items():
        command = [sys.executable, "-m", "tests.unit.patch_free_training", str(out)]
        command += ["--with-package"] if with_package else []
        started.append(
            subprocess.Popen(command, cwd=ROOT.parent, env=env, stderr=subprocess.PIPE, text=True)
        )
    saved = []
    for proc, out in zip(started, outs.values()):
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        with np.load(out) as arrays:
            saved.append({k: arrays[k] for k in arrays.files})
    return saved


def test_models_without_the_block_train_bit_for_bit_as_without_the_package(tmp_path):
    """A plain Keras model (Embedding: sparse gradients, Dense) and Merlin's DLRM with its own
    embeddings, 3 steps of fit with Keras' new and legacy SGD, Adagrad and Adam: the same
    weights, bit for bit, in a process that never imported the package and in one that
    imported it and built a model of it (every patch in place)."""
    without, with_package = train_without_the_block(
        {False: tmp_path / "without.npz", True: tmp_path / "with.npz"}
    )

    patched = set(with_package.pop("installed"))
    assert {p.target for p in compat.patches() if p.when in EAGER} <= patched
    assert list(without.pop("installed")) == []
    assert sorted(with_package) == sorted(without)
    for kind in ("keras", "merlin"):
        for optimizer in ("new.SGD", "legacy.SGD", "new.Adagrad", "legacy.Adagrad"):
            assert f"{kind}.{optimizer}.0" in without  # every case ran
    differ = [k for k in without if not np.array_equal(without[k], with_package[k])]
    assert differ == []


def test_installing_the_hooks_again_wraps_nothing_twice():
    import tensorflow as tf
    from merlin.models.tf.models.base import BaseModel

    from merlin_models_de.merlin import hooks

    owners = [(tf.keras.Model, "compile"), (BaseModel, "fit"), (BaseModel, "compile")]
    owners += [(tf.keras.optimizers.legacy.SGD, "_resource_apply_sparse_duplicate_indices")]
    before = [getattr(owner, name) for owner, name in owners]
    hooks.install()
    assert [getattr(owner, name) for owner, name in owners] == before
    assert all(hasattr(f, "__wrapped__") or f.__module__.startswith(ROOT.name) for f in before)
