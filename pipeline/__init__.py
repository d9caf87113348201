"""End-to-end orchestration (the demo): each step calls into the other packages."""
