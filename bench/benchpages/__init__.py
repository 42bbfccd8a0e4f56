"""The benchmark pages of the documentation site, built from bench/results/ (see bench/pages.py)."""
