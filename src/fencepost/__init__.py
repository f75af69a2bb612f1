"""fencepost: a lock and lease service with fencing tokens."""

__version__ = "0.1.0"
