"""Every setting: its environment variable, parser, default and meaning, in one table.

:data:`KNOBS` is what :func:`common.core.config.load_settings` reads and what README's
configuration table is generated from (``python -m devtools.readme``). A knob marked ``secret``
or ``url`` is never shown with its password, and may be read from a file instead
(``NAME_FILE``, :attr:`Knob.file_env`).

The table is not written here: each setting is declared once, as a field of its settings group
(:mod:`common.core.settings`), and :data:`KNOBS` is read off
:class:`common.core.config.Settings`' fields, in the groups' order. This module names the
table for the code that reads it.
"""

from __future__ import annotations

from common.core.config import KNOBS
from common.core.settings.declare import Knob, url_list_secrets

__all__ = ["KNOBS", "Knob", "url_list_secrets"]
