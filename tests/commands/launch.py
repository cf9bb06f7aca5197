"""What a test needs to start a command as a subprocess."""

import os
import sys

# the venv's horovodrun, and the environment of a command run as a subprocess (no TF notices)
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
QUIET_ENV = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3")
