"""The asyncio client's public import path: ``from disque_mp.aclient import AsyncDisque``.
It lives in ``disque_mp.client.aio`` beside the synchronous client."""

from disque_mp.client.aio import AsyncDisque

__all__ = ["AsyncDisque"]
