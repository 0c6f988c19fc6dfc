"""scrape_fleet: the public API of the fleet — what your handlers, pipelines and sinks import.

Everything named in ``__all__`` follows semantic versioning (CHANGELOG.md); the engine under
``common/`` may change in any release.
"""

from __future__ import annotations

__version__ = "0.2.0"

__all__ = ["__version__"]
