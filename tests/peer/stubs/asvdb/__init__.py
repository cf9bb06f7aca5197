"""Stub of asvdb (NVIDIA's benchmark DB) for Merlin Models' tests/conftest.py.

Only names imported at module level are provided; benchmark fixtures are never used by the
unit tests this harness runs.
"""


class BenchmarkInfo:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class BenchmarkResult:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class ASVDb:
    def __init__(self, *args, **kwargs):
        pass

    def addResult(self, *args, **kwargs):  # noqa: N802
        pass


class utils:  # noqa: N801  (asvdb.utils module stand-in)
    @staticmethod
    def getCommitInfo():  # noqa: N802
        return ("0" * 40, 0)

    @staticmethod
    def getRepoInfo():  # noqa: N802
        return ("", "")
