"""pytest's log capture and logger registration in another thread take turns (the patch at the
top of tests/conftest.py): without it, a logger registered while pytest walks the registry
raises "dictionary changed size during iteration", the error two fresh-clone runs hit in
tests/store/test_sentinel.py while services booted in background threads."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO_ROOT

# A non-propagating logger gets pytest's handler during the walk; its addHandler has another
# thread register a logger and waits for it (0.3 s at most): mid-walk without the lock, after
# the walk with it.
RACE = """
import itertools, logging, threading
import tests.conftest  # noqa: F401 - its patch of pytest's catching_logs
from _pytest import logging as pytest_logging
numbers = itertools.count()
class Trigger(logging.Logger):
    def addHandler(self, handler):
        super().addHandler(handler)
        thread = threading.Thread(target=lambda: logging.getLogger(f"booted.{next(numbers)}"))
        thread.start()
        thread.join(0.3)
logging.setLoggerClass(Trigger)
logging.getLogger("trigger").propagate = False
logging.setLoggerClass(logging.Logger)
for n in range(10):
    logging.getLogger(f"after.{n}")
errors = 0
for _ in range(5):
    capture = pytest_logging.catching_logs(logging.NullHandler(), level=logging.DEBUG)
    try:
        capture.__enter__()
    except RuntimeError:
        errors += 1
        continue
    capture.__exit__(None, None, None)
print(errors)
"""


def test_log_capture_survives_a_logger_registered_by_another_thread_meanwhile() -> None:
    done = subprocess.run([sys.executable, "-c", RACE], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, check=False)

    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "0", f"{done.stdout.strip()} of 5 captures raised"
