"""A command's quiet start (apps/common/console.py): Merlin's import warnings and TensorFlow's
moved-module line are dropped, other warnings kept, a user's TF_CPP_MIN_LOG_LEVEL wins."""

import logging
import os
import warnings

from merlin_models_de.apps.common import console


def test_known_noise_is_dropped_and_the_rest_kept(monkeypatch):
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    logger = logging.getLogger("tensorflow")
    before = list(logger.filters)
    # another test of this worker may have quieted the process already: start without it
    logger.filters[:] = [f for f in before if not isinstance(f, console._DropMovedModule)]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            console.quiet_imports()
            console.quiet_imports()  # idempotent
            warnings.warn(
                "Initializing an NVTabular Dataset in CPU mode, slow", UserWarning, stacklevel=1
            )
            warnings.warn("a warning of the user's own", UserWarning, stacklevel=1)
        assert [str(w.message) for w in caught] == ["a warning of the user's own"]
        added = [f for f in logger.filters if isinstance(f, console._DropMovedModule)]
        assert len(added) == 1
        record = logging.makeLogRecord({"msg": "module moved. Please fix your imports."})
        assert not added[0].filter(record)
        assert added[0].filter(logging.makeLogRecord({"msg": "a real error"}))
    finally:
        logger.filters[:] = before
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    console.quiet_imports()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"
    logger.filters[:] = before
