"""The paged-shop example: listing and product handlers and an item pipeline (README.md here)."""
