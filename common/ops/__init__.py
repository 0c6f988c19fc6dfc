"""Operating the fleet: what the entry scripts share (settings, logging, exit codes), the status
view, dead-letter tools, export, progress bars.

May import: every room.
"""
