"""The package version, below everything: kforge_tui/__init__.py re-exports it, and modules
inside the package read it here (the package face is for users, not for its own modules)."""
__version__ = "0.1.0"
