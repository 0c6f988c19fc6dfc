"""The news example: seeded from the sitemap, a rules file chooses the handler (README.md here)."""
