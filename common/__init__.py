"""The fleet's logic, in rooms named after a URL's journey; the entry scripts are thin.

Floors, lowest first: ``core``; ``broker`` and ``store``; ``web``; ``intake``; ``work``;
``sink``; ``ops``.
A room imports only rooms on lower floors (checked by tests/test_layout.py).
"""
