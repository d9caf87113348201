"""optimization package."""
