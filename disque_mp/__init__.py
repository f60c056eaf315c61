"""disque-mp: a multi-process Disque node."""

__version__ = "0.1.0"
