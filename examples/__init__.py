"""Worked examples (docs/nvtabular.md, docs/serving.md): each module is a script, runnable as
``python examples/<name>.py``; the tests import them from the repository's root."""
