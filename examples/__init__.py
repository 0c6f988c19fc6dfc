"""Runnable example projects: a documentation site, a paged shop and a news site read from its
sitemap, each a router of handlers (``examples.NAME.handlers:router``) and a README saying how
to run it against its site from ``devtools.example_sites`` (docs/examples.md has all three)."""
