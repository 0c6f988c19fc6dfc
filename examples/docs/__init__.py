"""The documentation-site example: one handler, Markdown out (see README.md here)."""
