"""Stub of GitPython for merlin.models.utils.ci_utils (used only to find changed backends).

``Repo(...)`` raises, so Merlin's tests/conftest.py falls back to "run all tests".
"""


class InvalidGitRepositoryError(Exception):
    pass


class Repo:
    def __init__(self, *args, **kwargs):
        raise InvalidGitRepositoryError("git stub: no repository (merlin_models_de peer harness)")
