"""The fastdecode version, in a module of its own so that modules inside the package
(an exported package's metadata, `fastdecode --version`) read it without importing the
public API in `__init__`."""

__version__ = "0.1.0"
