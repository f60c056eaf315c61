"""systemd's sd_notify, without libsystemd: one datagram to $NOTIFY_SOCKET.

systemd (Type=notify) sets NOTIFY_SOCKET to a filesystem path or, with a
leading ``@``, a name in the abstract namespace. Without it (not run by
systemd) notify() does nothing, so the same binary runs anywhere.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)
notify_bytes_max = 4096  # our states are a few lines; systemd accepts far more
watchdog_interval_s_min = 0.05  # a tiny WatchdogSec must not make the loop spin


def _address(raw: str) -> str | None:
    if raw.startswith("@"):
        return "\0" + raw[1:]  # abstract namespace
    if raw.startswith("/"):
        return raw
    return None  # vsock: and other forms we do not speak


def notify(state: str, environ: dict[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. ``"READY=1\\nSTATUS=..."``); True if it was sent."""
    env = os.environ if environ is None else environ
    raw = env.get("NOTIFY_SOCKET", "")
    if not raw:
        return False
    addr = _address(raw)
    data = state.encode()
    if addr is None or len(data) > notify_bytes_max:
        log.warning("sd_notify: unsupported NOTIFY_SOCKET %r or state too long", raw)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            s.sendall(data)
    except OSError as e:
        log.warning("sd_notify to %r failed: %s", raw, e)
        return False
    return True


def watchdog_interval_s(environ: dict[str, str] | None = None) -> float | None:
    """How often to send WATCHDOG=1 (half of WatchdogSec), or None when off.

    systemd sets WATCHDOG_USEC (and WATCHDOG_PID: only that process must pet).
    """
    env = os.environ if environ is None else environ
    usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid != str(os.getpid()):
        return None
    return max(int(usec) / 2e6, watchdog_interval_s_min)
