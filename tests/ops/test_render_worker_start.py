"""A render worker checks what it needs before it takes a page (common/ops/cli_run.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import REPO_ROOT


def _work(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "worker.py", *args], cwd=REPO_ROOT, text=True,
                          capture_output=True, timeout=60, check=False,
                          env={**os.environ, "RABBITMQ_URL": "amqp://fleet:unseen-7c1d@127.0.0.1:1/",
                               "REDIS_URL": "redis://127.0.0.1:1/0", **env})


def test_a_render_worker_without_its_browser_stops_at_start_naming_the_setting():
    done = _work("--render", "--idle-exit", "1", BROWSER_EXECUTABLE="/nonexistent/chromium")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "BROWSER_EXECUTABLE=/nonexistent/chromium: not an executable file" in done.stderr
    assert "apt install chromium" in done.stderr


def test_a_render_worker_without_playwright_stops_at_start_saying_what_to_install(tmp_path):
    # Playwright hidden as if not installed: None in sys.modules (importlib's own convention).
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['playwright'] = None\n",
                                               encoding="utf-8")
    done = _work("--render", "--idle-exit", "1",
                 PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "a render worker needs Playwright for Python" in done.stderr
    assert "scrape-fleet[render]" in done.stderr

