"""Jobs: many crawls on one fleet. A job file validated whole, the registry of jobs and their
runs in Redis, their lifecycle, and the runner that seeds, schedules and finishes them.

May import: ``common.core``, ``common.broker``, ``common.store``, ``common.web``,
``common.intake``.
"""
