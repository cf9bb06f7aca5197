"""Tests mirror the package: every module of merlin_models_de has a test module named for it.

The naming rule (one name never fits two modules; ``test_names_are_unambiguous`` checks it):

- ``pkg/folder/module.py`` is named by ``test_<folder>_<module>.py`` (its own folder only,
  e.g. ``backends/horovod/exchange.py`` -> ``test_horovod_exchange.py``), and also by
  ``test_<module>.py`` when no other module has that file name and no folder of the package
  has that name and it is not another module's folder form (``persistence/retention.py`` ->
  ``test_retention.py``, but the three ``memory.py`` take the folder form, ``compat/merlin.py``
  too because of ``merlin/``, and ``compat/merlin_hooks.py`` because of ``merlin/hooks.py``);
- a module at the package root is named by ``test_<module>.py`` (``comm.py`` -> ``test_comm.py``);
- a package's ``__init__.py`` or an app's ``__main__.py`` that defines a function or class is
  named for its folder (``planner/__init__.py`` -> ``test_planner.py``, the root
  ``__init__.py`` -> ``test_merlin_models_de.py``, ``apps/next_item/__main__.py`` ->
  ``test_next_item.py``).

Excluded, because there is nothing of their own to test: ``__init__.py`` and ``__main__.py``
files that define no function or class (they only gather names, or call a ``main`` that has its
own module); the names they gather are tested where they are defined.

A test module counts wherever its test needs to run: tests/unit, tests/commands, tests/ranks,
tests/multihost or tests/peer (subfolders included). Helper modules without the ``test_``
prefix do not count.

``WITHOUT_TEST`` lists the modules (at most 10) that stay without a test of their own, each
with the test that covers it and why that is enough; ``NOT_NAMED_YET`` is the rest of the
work, a list that may only shrink (an entry that gains a test fails until it is taken off).
"""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "merlin_models_de"
TIERS = ("unit", "commands", "ranks", "multihost", "peer")

# Modules with no test named for them, each with why (at most 10).
_ELASTIC = "an elastic reset shows only when a host of a multi-host job dies: tests/multihost/test_elastic.py"
_PATCHES = "checked by tests/unit/test_patches.py (the patch registry's own test)"
WITHOUT_TEST = {
    "apps/common/elastic_training.py": _ELASTIC,
    "apps/dlrm/elastic.py": _ELASTIC + " (its DLRM run with --elastic)",
    "apps/next_item/elastic.py": _ELASTIC + " (its next-item run with --elastic)",
    "elastic/state.py": _ELASTIC + " (its elastic_job.py)",
    "compat/__init__.py": _PATCHES + ": patches() and patches_markdown()",
    "compat/registry.py": _PATCHES,
    "merlin/hooks.py": _PATCHES + ", and every fit / evaluate / predict test runs them",
    "apps/bench/step_breakdown.py": "a bench run's breakdown: tests/commands/test_bench_dlrm.py",
    "backends/horovod/backend.py": "the backend against the one-process oracle on 2 ranks: "
    "tests/ranks/test_oracle.py",
}

# Not named yet (issue 54, item 6): this list only shrinks; a module here that gains a test
# fails test_allow_list_is_short_and_current until it is removed.
NOT_NAMED_YET = (
    "apps/bench/cost.py",
    "apps/bench/next_item.py",
    "apps/common/optimizers.py",
    "apps/dlrm/model.py",
    "apps/dlrm/options.py",
    "apps/dlrm/run.py",
    "apps/next_item/data.py",
    "apps/next_item/run.py",
    "backends/base.py",
    "backends/horovod/wire.py",
    "backends/lookup.py",
    "block/views.py",
    "compat/horovod.py",
    "compat/keras.py",
    "compat/merlin.py",
    "compat/merlin_hooks.py",
    "compat/nvtabular.py",
    "compat/tf_checkpoint.py",
    "merlin/batches.py",
    "merlin/calls.py",
    "merlin/ending.py",
    "merlin/optimizers.py",
    "merlin/register.py",
    "outputs/bias.py",
    "outputs/compiled.py",
    "outputs/samplers.py",
    "outputs/target_rank.py",
    "persistence/state.py",
    "serving/faiss_index.py",
    "serving/loading.py",
    "serving/model_inputs.py",
    "serving/served_workflow.py",
)


def _defines_code(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return any(isinstance(node, kinds) for node in tree.body)


def package_modules() -> list[Path]:
    """Every module the rule covers, relative to the package folder."""
    modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.stem in ("__init__", "__main__") and not _defines_code(path):
            continue
        modules.append(path.relative_to(PACKAGE))
    return modules


def accepted_names(modules: list[Path]) -> dict[Path, set[str]]:
    """The test module names (without ``.py``) that name each module."""
    folders = {p.name for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    stems = defaultdict(int)
    for module in modules:
        stems[module.stem] += 1
    folder_forms = {
        f"test_{m.parent.name}_{m.stem}" for m in modules if m.parent.name and m.stem[0] != "_"
    }
    names = {}
    for module in modules:
        folder = module.parent.name
        if module.stem in ("__init__", "__main__"):
            names[module] = {f"test_{folder or PACKAGE.name}"}
            continue
        own = {f"test_{folder}_{module.stem}"} if folder else set()
        short = f"test_{module.stem}"
        unique = stems[module.stem] == 1 and short not in folder_forms
        if not folder or (unique and module.stem not in folders):
            own.add(short)
        names[module] = own
    return names


def test_module_names() -> set[str]:
    found = set()
    for tier in TIERS:
        found |= {p.stem for p in (ROOT / "tests" / tier).rglob("test_*.py")}
    return found


test_module_names.__test__ = False  # a helper, not a test


def test_names_are_unambiguous():
    owners = defaultdict(list)
    for module, names in accepted_names(package_modules()).items():
        assert names, f"{module} can be named by no test module"
        for name in names:
            owners[name].append(str(module))
    shared = {name: mods for name, mods in owners.items() if len(mods) > 1}
    assert not shared, f"test module names that would fit several modules: {shared}"


def test_every_module_has_a_test_named_for_it():
    present = test_module_names()
    missing = sorted(
        f"{module} (name a test {' or '.join(sorted(f'{n}.py' for n in names))})"
        for module, names in accepted_names(package_modules()).items()
        if not names & present and str(module) not in {*WITHOUT_TEST, *NOT_NAMED_YET}
    )
    assert not missing, f"{len(missing)} modules have no test named for them:\n" + "\n".join(
        missing
    )


def test_allow_list_is_short_and_current():
    modules = {str(m) for m in package_modules()}
    assert len(WITHOUT_TEST) <= 10, f"{len(WITHOUT_TEST)} modules allowed without a test"
    assert set(WITHOUT_TEST) <= modules, f"not modules: {set(WITHOUT_TEST) - modules}"
    present = test_module_names()
    names = accepted_names(package_modules())
    assert set(NOT_NAMED_YET) <= modules, f"not modules: {set(NOT_NAMED_YET) - modules}"
    named = [m for m in (*WITHOUT_TEST, *NOT_NAMED_YET) if names[Path(m)] & present]
    assert not named, f"listed without a test but named by one (take them off): {named}"
    assert all(reason.strip() for reason in WITHOUT_TEST.values()), "each needs its reason"
