"""The package's shape: folders in a layer order that imports follow (downwards only), no
import cycles, the library never imports an application, a command never imports another
command's folder (but the bench, the DLRM command it measures, one way), Horovod is imported only by comm and compat, and unsupported versions fail
with one clear message."""

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

import merlin_models_de
from merlin_models_de import compat

ROOT = pathlib.Path(merlin_models_de.__file__).parent
PACKAGE = "merlin_models_de"
HOROVOD_IMPORTERS = {f"{PACKAGE}.comm", f"{PACKAGE}.compat", f"{PACKAGE}.compat.horovod"}
# The layers, lowest first (docs/design.md): a module imports only from its own layer or
# below. The root leaves share layer 0 and import nothing of ours (comm reads the launch
# from `launchers`, one of them); the package's __init__
# (the public API) sits above everything.
LAYERS = [
    {"tables", "variables", "launchers"},
    {"comm"},
    {"compat"},
    {"runtime"},
    {"planner", "dynamic"},
    {"backends", "kernels"},
    {"persistence"},
    {"block"},
    {"outputs"},
    {"merlin"},
    {"elastic"},
    {"serving"},
    {"apps"},
]
# what may stay at the root: the small leaves of layer 0 and the public API
ROOT_MODULES = {
    "__init__",
    "tables",
    "variables",
    "launchers",
    "comm",
}
# apps/: one folder per command (dlrm, next_item, bench, tools) and what they share
SHARED_APPS = "common"
# the commands a folder measures, which it may import (one way: they never import it back)
MEASURED = {"bench": {"dlrm"}}


def module_names():
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(name, path, known):
    """Every package module ``name`` imports, at any depth of its code (lazy imports too)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1]
                    + ([base] if base else [])
                )
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def external_imports(path):
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out.add(node.module or "")
    return out


def graph():
    known = module_names()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def is_app(name):
    return name == f"{PACKAGE}.apps" or name.startswith(f"{PACKAGE}.apps.")


def apps_folder(name):
    """The folder under apps/ that holds module ``name`` (``common``, ``dlrm``, ...); None for
    apps' own __init__ and for the library's modules."""
    parts = name.split(".")
    return parts[2] if is_app(name) and len(parts) > 2 else None


def crossing_imports(edges):
    """``{module: [what it imports from another command's folder]}``: a command's folder
    imports only itself, apps/common, the commands it measures (``MEASURED``) and the
    library; apps/common imports no command."""
    out = {}
    for name, deps in edges.items():
        mine = apps_folder(name)
        if mine is None:
            continue
        allowed = {None, SHARED_APPS, mine, *MEASURED.get(mine, ())}
        bad = sorted(d for d in deps if apps_folder(d) not in allowed)
        if bad:
            out[name] = bad
    return out


def layer_of(name):
    """The layer index of a package module (None for the package's own __init__)."""
    if name == PACKAGE:
        return None
    top = name.split(".")[1]
    return next(i for i, layer in enumerate(LAYERS) if top in layer)


def find_cycle(edges):
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_graph_sees_lazy_imports():
    edges = graph()
    assert f"{PACKAGE}.persistence.export" in edges[f"{PACKAGE}.merlin.hooks"]
    assert f"{PACKAGE}.apps.dlrm.run" in edges[f"{PACKAGE}.apps.dlrm.__main__"]  # in main()


def test_every_module_has_a_layer_and_the_root_holds_only_leaves():
    names = module_names()
    for name in names:
        layer_of(name)  # raises StopIteration for a folder missing from LAYERS
    at_root = {pathlib.Path(p).stem for n, p in names.items() if pathlib.Path(p).parent == ROOT}
    assert at_root <= ROOT_MODULES, sorted(at_root - ROOT_MODULES)


def test_imports_point_down_the_layers():
    upward = {}
    for name, deps in graph().items():
        mine = layer_of(name)
        if mine is None:
            continue
        bad = sorted(d for d in deps if d != PACKAGE and layer_of(d) > mine)
        if mine == 0:  # the leaves import nothing of ours
            bad = sorted(d for d in deps if d != PACKAGE)
        if bad:
            upward[name] = bad
    assert upward == {}


def test_layer_check_finds_an_upward_import(monkeypatch):
    edges = graph()
    edges[f"{PACKAGE}.block.layer"] = edges[f"{PACKAGE}.block.layer"] | {f"{PACKAGE}.outputs.tied"}
    monkeypatch.setattr(sys.modules[__name__], "graph", lambda: edges)
    with pytest.raises(AssertionError, match="outputs.tied"):
        test_imports_point_down_the_layers()


# the backends' implementations: only the registry imports them (by name, when one is chosen),
# and each imports its own modules
IMPLEMENTATIONS = (f"{PACKAGE}.backends.horovod", f"{PACKAGE}.backends.distributed_embeddings")


def implementation_of(name):
    """The implementation (of IMPLEMENTATIONS) module ``name`` belongs to, or None."""
    return next((i for i in IMPLEMENTATIONS if name == i or name.startswith(i + ".")), None)


def test_only_the_registry_imports_a_backend_implementation():
    leaks = {}
    for name, deps in graph().items():
        bad = sorted(d for d in deps if implementation_of(d) not in (None, implementation_of(name)))
        if bad:
            leaks[name] = bad
    assert leaks == {}
    from merlin_models_de.backends import registry

    named = {implementation_of(t.partition(":")[0]) for t in registry._CLASSES.values()}
    assert named == set(IMPLEMENTATIONS)


def test_backend_check_finds_an_import_of_an_implementation(monkeypatch):
    edges = graph()
    hooks = f"{PACKAGE}.merlin.hooks"
    edges[hooks] = edges[hooks] | {f"{PACKAGE}.backends.horovod.ahead"}
    monkeypatch.setattr(sys.modules[__name__], "graph", lambda: edges)
    with pytest.raises(AssertionError, match="merlin.hooks.*backends.horovod.ahead"):
        test_only_the_registry_imports_a_backend_implementation()


def test_the_block_does_not_import_the_output_side_or_the_hooks():
    # the hooks go in at registration (merlin/register.py), never from the block
    deps = {d for n, ds in graph().items() if n.startswith(f"{PACKAGE}.block") for d in ds}
    assert {d for d in deps if d.startswith((f"{PACKAGE}.outputs", f"{PACKAGE}.merlin"))} == set()


def test_no_import_cycles():
    assert find_cycle(graph()) is None, f"import cycle: {' -> '.join(find_cycle(graph()))}"


def test_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_library_never_imports_an_application():
    bad = {m: sorted(d for d in deps if is_app(d)) for m, deps in graph().items() if not is_app(m)}
    assert {m: d for m, d in bad.items() if d} == {}


def test_every_app_sits_in_a_folder():
    apps = ROOT / "apps"
    stray = sorted(p.name for p in apps.glob("*.py") if p.name != "__init__.py")
    assert stray == []
    assert {p.parent.name for p in apps.glob("*/*.py")} >= {
        SHARED_APPS,
        "dlrm",
        "next_item",
        "bench",
        "tools",
    }


def test_a_command_imports_only_its_own_folder_common_and_the_library():
    assert crossing_imports(graph()) == {}


def test_the_command_check_finds_a_crossing_import():
    edges = graph()
    run, epochs = f"{PACKAGE}.apps.next_item.run", f"{PACKAGE}.apps.common.epochs"
    dlrm, bench = f"{PACKAGE}.apps.dlrm.run", f"{PACKAGE}.apps.bench.step_breakdown"
    edges[run] = edges[run] | {f"{PACKAGE}.apps.dlrm.report"}
    edges[epochs] = edges[epochs] | {f"{PACKAGE}.apps.bench.runs"}
    edges[dlrm] = edges[dlrm] | {f"{PACKAGE}.apps.bench.runs"}  # the measured never import back
    edges[bench] = edges[bench] | {f"{PACKAGE}.apps.next_item.run"}  # measures DLRM only
    assert crossing_imports(edges) == {
        run: [f"{PACKAGE}.apps.dlrm.report"],
        epochs: [f"{PACKAGE}.apps.bench.runs"],
        dlrm: [f"{PACKAGE}.apps.bench.runs"],
        bench: [f"{PACKAGE}.apps.next_item.run"],
    }
    assert f"{PACKAGE}.apps.dlrm.options" in graph()[bench]  # the one crossing allowed


def test_every_console_script_names_a_command_main():
    import importlib
    import tomllib

    pyproject = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())
    scripts = pyproject["project"]["scripts"]
    assert set(scripts) == {"mmde-dlrm", "mmde-next-item", "mmde-plan", "mmde-bench"}
    for name, target in scripts.items():
        module, _, function = target.partition(":")
        assert is_app(module) and callable(getattr(importlib.import_module(module), function)), name


def test_variables_is_a_leaf():
    assert graph()[f"{PACKAGE}.variables"] == set()


def test_horovod_is_imported_only_by_comm_and_compat():
    offenders = sorted(
        name
        for name, path in module_names().items()
        if any(m == "horovod" or m.startswith("horovod.") for m in external_imports(path))
        and name not in HOROVOD_IMPORTERS
    )
    assert offenders == []


def test_private_merlin_and_horovod_api_only_in_compat():
    # the private members this package touches; only compat may name them
    private = (
        "_allreduce_grads",
        "_allreduce(",
        "_add_horovod_callbacks",
        "_create_all_weights",
        "global_rank",
        "seed_fn",
    )
    # whole names only: the public grouped_allreduce( is not the private _allreduce(
    patterns = {p: re.compile(r"(?<![A-Za-z0-9_])" + re.escape(p)) for p in private}
    offenders = {}
    for name, path in module_names().items():
        if name == f"{PACKAGE}.compat" or name.startswith(f"{PACKAGE}.compat."):
            continue
        text = path.read_text()
        hits = [p for p in private if patterns[p].search(text)]
        if hits:
            offenders[name] = hits
    assert offenders == {}


def test_planner_function_is_not_shadowed_by_a_module():
    from merlin_models_de import make_plan
    from merlin_models_de.planner import plan

    assert make_plan is plan and callable(merlin_models_de.make_plan)


def test_the_public_api_names_resolve_and_shadow_no_merlin_name():
    import merlin.models.tf as mm

    for name in merlin_models_de.__all__:
        assert getattr(merlin_models_de, name) is not None, name
    clashes = sorted(
        n for n in merlin_models_de.__all__ if hasattr(mm, n) and n != "DistributedEmbeddings"
    )
    assert clashes == []
    assert mm.DistributedEmbeddings is merlin_models_de.DistributedEmbeddings


def test_supported_versions_pass():
    compat.check_versions({"tensorflow": "2.12.1", "merlin-models": "23.8.0", "horovod": "0.28.1"})
    compat.check_versions({"tensorflow": "2.12.0", "merlin-models": "23.8.0", "horovod": None})


@pytest.mark.parametrize(
    "found, named",
    [
        (
            {"tensorflow": "2.15.0", "merlin-models": "23.8.0", "horovod": "0.28.1"},
            "tensorflow 2.15.0 (supported: 2.12.*)",
        ),
        (
            {"tensorflow": "2.12.1", "merlin-models": "23.4.0", "horovod": "0.28.1"},
            "merlin-models 23.4.0 (supported: 23.8.*)",
        ),
        (
            {"tensorflow": "2.12.1", "merlin-models": "23.8.0", "horovod": "0.27.0"},
            "horovod 0.27.0 (supported: 0.28.*)",
        ),
        (
            {"tensorflow": "2.12.1", "merlin-models": None, "horovod": "0.28.1"},
            "merlin-models not installed",
        ),
    ],
)
def test_unsupported_versions_fail_with_what_was_found(found, named):
    with pytest.raises(compat.UnsupportedVersionError) as err:
        compat.check_versions(found)
    assert named in str(err.value) and compat.SKIP_ENV in str(err.value)


FAKE_TF_VERSION = """
import importlib.metadata as md
real = md.version
md.version = lambda name: "2.16.1" if name.startswith("tensorflow") else real(name)
import merlin_models_de
from merlin.datasets.synthetic import generate_data
import merlin.models.tf as mm
try:
    mm.DistributedEmbeddings(generate_data("criteo", 8).schema, dim=4)
except merlin_models_de.compat.UnsupportedVersionError as err:
    print("REFUSED:", err)
"""


def test_the_block_refuses_an_unsupported_install_at_first_use():
    env = {k: v for k, v in os.environ.items() if k != compat.SKIP_ENV}
    out = subprocess.run(
        [sys.executable, "-c", FAKE_TF_VERSION],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(env, PYTHONWARNINGS="ignore"),
    )
    assert (
        "REFUSED: merlin_models_de does not support the installed tensorflow 2.16.1" in out.stdout
    ), out.stderr[-2000:]


# modules that import merlin.models.tf, whose first import installs the hooks (registration):
# whichever of them a process imports first, that import must not cycle back into it
FIRST_IMPORTS = ["outputs.topk", "outputs.tied", "block.handles", "block.layer", "merlin.hooks"]


def test_any_module_can_be_the_first_import():
    code = (
        "import importlib, sys; importlib.import_module(sys.argv[1]); "
        "import merlin.models.tf as mm, merlin_models_de; "
        "assert mm.DistributedEmbeddings is merlin_models_de.DistributedEmbeddings; "
        "print('imported', sys.argv[1])"
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", code, f"{PACKAGE}.{name}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in FIRST_IMPORTS
    ]
    failed = {}
    for name, run in zip(FIRST_IMPORTS, runs):
        out, err = run.communicate(timeout=600)
        if run.returncode != 0 or f"imported {PACKAGE}.{name}" not in out:
            failed[name] = err.strip().splitlines()[-1:]
    assert failed == {}
