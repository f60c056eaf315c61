"""TLS contexts from Redis' directives (README, Security).

``tls-port`` serves clients over TLS beside the plain port (``port``);
``tls-cert-file`` / ``tls-key-file`` are this node's certificate and key (PEM),
``tls-ca-cert-file`` the CA that signs clients and peers, ``tls-auth-clients``
(``yes``: a client certificate is required, ``optional``: checked when sent,
``no``), ``tls-protocols`` the versions allowed (TLS 1.2 and up by default).
``tls-cluster yes`` runs every bus link and data link over mutual TLS with the
same certificate; the cluster secret's MACs stay on top of it.

A TLS connection keeps its state in this process, so it is never handed to
another worker (its commands are forwarded instead), and with ``tls-cluster``
data links are read by worker 0.
"""

from __future__ import annotations

import ssl
from typing import Any


class TlsConfigError(Exception):
    """The TLS directives cannot be used; the message says why."""


def _versions(ctx: ssl.SSLContext, protocols: str) -> None:
    words = {w.lower() for w in protocols.split()}
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if words:
        ctx.minimum_version = (ssl.TLSVersion.TLSv1_2 if "tlsv1.2" in words
                               else ssl.TLSVersion.TLSv1_3)
        ctx.maximum_version = (ssl.TLSVersion.TLSv1_3 if "tlsv1.3" in words
                               else ssl.TLSVersion.TLSv1_2)


def _no_session_tickets(ctx: ssl.SSLContext) -> None:
    """No TLS 1.3 session tickets: every worker has its own ticket keys, so a ticket
    could not resume a session on the worker the kernel picks next, and tickets sent
    right after the handshake are bytes a client finds waiting before its first
    command (redis-py then drops the fresh connection as "not ready")."""
    ctx.num_tickets = 0


def _load(ctx: ssl.SSLContext, cfg: Any, need_ca: bool) -> None:
    if not cfg.tls_cert_file or not cfg.tls_key_file:
        raise TlsConfigError("tls-cert-file and tls-key-file are required for TLS")
    try:
        ctx.load_cert_chain(cfg.tls_cert_file, cfg.tls_key_file)
        if cfg.tls_ca_cert_file:
            ctx.load_verify_locations(cfg.tls_ca_cert_file)
        elif need_ca:
            raise TlsConfigError("tls-ca-cert-file is required to check certificates")
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot load the TLS files: {exc}") from None


def server_context(cfg: Any) -> ssl.SSLContext:
    """The client port's TLS (``tls-port``)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _no_session_tickets(ctx)
    _versions(ctx, cfg.tls_protocols)
    mode = cfg.tls_auth_clients
    _load(ctx, cfg, need_ca=mode != "no")
    ctx.verify_mode = {"yes": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL}.get(
        mode, ssl.CERT_NONE)
    return ctx


def https_context(cfg: Any) -> ssl.SSLContext | None:
    """The HTTP endpoint's TLS: the node's certificate whenever one is configured
    (browsers present no client certificate, so none is asked for)."""
    if not cfg.tls_cert_file or not cfg.tls_key_file:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _no_session_tickets(ctx)
    _versions(ctx, cfg.tls_protocols)
    _load(ctx, cfg, need_ca=False)
    return ctx


def bus_contexts(cfg: Any) -> tuple[ssl.SSLContext, ssl.SSLContext] | None:
    """(server, client) contexts for the bus with ``tls-cluster yes``, else None.
    Both sides show the node certificate and require the peer's, signed by the CA;
    nodes are dialled by IP, so the peer's name is not checked (the CA and the
    cluster secret say who may be a node)."""
    if not cfg.tls_cluster:
        return None
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    for ctx in (server, client):
        _versions(ctx, cfg.tls_protocols)
        _load(ctx, cfg, need_ca=True)
        ctx.verify_mode = ssl.CERT_REQUIRED
    client.check_hostname = False
    _no_session_tickets(server)
    return server, client
