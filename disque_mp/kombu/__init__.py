"""Celery/kombu broker on Disque: importing this package registers ``disque://``
(the broker and, with Celery installed, the result backend:
``disque_mp.kombu.backend``).

    import disque_mp.kombu
    app = Celery("tasks", broker="disque://127.0.0.1:7711", backend="disque://127.0.0.1:7711")

or, without the import, ``broker_transport="disque_mp.kombu:Transport"``.
See ``disque_mp.kombu.transport`` for the mapping and the transport options.
"""

from __future__ import annotations

from kombu.transport import TRANSPORT_ALIASES

from disque_mp.kombu.transport import Channel, QoS, Transport

TRANSPORT_ALIASES.setdefault("disque", "disque_mp.kombu:Transport")
try:
    from celery.app.backends import BACKEND_ALIASES
except ImportError:  # kombu without Celery: the broker only
    pass
else:
    BACKEND_ALIASES.setdefault("disque", "disque_mp.kombu.backend:DisqueBackend")

__all__ = ["Channel", "QoS", "Transport"]
