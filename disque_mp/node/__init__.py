"""The node: supervisor, worker processes, the RESP front end and its command
handlers, AOF, memory accounting, config and logging. Users never import this;
they run ``disque-mp`` (``disque_mp.cli``) and talk RESP to it."""
