"""Peer crawlers the bench runs in bench/.venv against the fleet (one module per peer)."""
