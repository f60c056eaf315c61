"""Offline tools behind ``disque-mp`` subcommands (``check-aof``)."""
