"""The command table (``table``) and the front-end handlers it names: job and queue
commands (``jobs``), node-wide commands (``admin``), ``CLUSTER`` (``cluster``)."""
