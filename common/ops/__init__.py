"""Operating the fleet: the ``scrape-fleet`` command and the entry scripts' bodies, what they
share (settings, logging, exit codes), local mode (RabbitMQ, Redis, workers and a sink on this
machine), the status view with the crawl's progress, dead-letter tools, export, progress bars.

May import: every room.
"""
