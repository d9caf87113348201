"""modeling package."""
