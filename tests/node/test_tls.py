"""TLS on the client port (redis-py, redis-cli, the project's client) and on the
cluster bus (``tls-cluster yes``), with certificates made here by the openssl CLI."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis

from bus import frames
from bus.hostbus import K_HANDSHAKE
from disque_mp.client import Disque
from tests.nodeproc import NodeProc, form_cluster, free_port, unique_queue, wait_until

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("openssl") is None,
                                 reason="the openssl CLI is needed to make test certificates")]
wait_s = 40.0


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(d: Path) -> dict[str, str]:
    """A CA, a node certificate (SAN 127.0.0.1) and a client certificate, EC P-256."""
    d.mkdir(exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=disque-mp test CA", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("node", "client"):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", "san.ext",
                 cwd=d)
    return {n: str(d / n) for n in ("ca.crt", "node.crt", "node.key", "client.crt", "client.key")}


def tls_conf(pki: dict[str, str], tls_port: int = 0,
             extra: dict[str, Any] | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"tls-cert-file": pki["node.crt"], "tls-key-file": pki["node.key"],
                            "tls-ca-cert-file": pki["ca.crt"]}
    if tls_port:
        conf["tls-port"] = tls_port
    conf.update(extra or {})
    return conf


def ssl_kwargs(pki: dict[str, str]) -> dict[str, Any]:
    return {"ssl": True, "ssl_ca_certs": pki["ca.crt"], "ssl_certfile": pki["client.crt"],
            "ssl_keyfile": pki["client.key"], "ssl_check_hostname": False}


def test_tls_client_port(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    tls_port = free_port()
    with NodeProc(tmp_path / "n", workers=2, conf=tls_conf(pki, tls_port)) as node:
        q = unique_queue()
        r = redis.Redis(host="127.0.0.1", port=tls_port, socket_timeout=10, **ssl_kwargs(pki))
        jid = r.execute_command("ADDJOB", q, "over tls", 0)
        assert jid.startswith(b"D-")
        # a pipeline of one queue: TLS connections are never handed off, commands forward
        pipe = r.pipeline(transaction=False)
        for i in range(40):
            pipe.execute_command("ADDJOB", q, f"job {i}", 0)
        assert all(j.startswith(b"D-") for j in pipe.execute())
        assert r.execute_command("QLEN", q) == 41
        got = r.execute_command("GETJOB", "NOHANG", "FROM", q)
        assert got[0][2] == b"over tls"
        r.close()
        # a client without a certificate is refused (tls-auth-clients yes)
        bare = redis.Redis(host="127.0.0.1", port=tls_port, socket_timeout=10, ssl=True,
                           ssl_ca_certs=pki["ca.crt"], ssl_check_hostname=False)
        with pytest.raises((redis.ConnectionError, ssl.SSLError, OSError)):
            bare.ping()
        bare.close()
        # redis-cli --tls
        if shutil.which("redis-cli"):
            out = subprocess.run(["redis-cli", "--tls", "--cacert", pki["ca.crt"], "--cert",
                                  pki["client.crt"], "--key", pki["client.key"], "-p",
                                  str(tls_port), "QLEN", q], capture_output=True, timeout=30,
                                 check=True)
            assert out.stdout.strip() == b"40"
        # the project's client (and so the Spark source) through redis_kwargs
        d = Disque([f"127.0.0.1:{tls_port}"], redis_kwargs=ssl_kwargs(pki),
                   failover_attempts=0, follow_priority=False, socket_timeout=10)
        job_id = d.add_job(q, b"from the client")
        assert job_id.startswith("D-")
        assert d.qlen(q) == 41
        d.close()
        # the plain port still serves
        plain = node.client(protocol=2)
        assert plain.execute_command("QLEN", q) == 41
        plain.close()
        assert "Traceback" not in node.log_text()


def test_tls_cluster_replicates_and_federates(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    secret = tmp_path / "cluster.secret"
    secret.write_text("the secret of the TLS cluster test\n")
    nodes = [NodeProc(tmp_path / f"n{i}", workers=2,
                      conf=tls_conf(pki, 0, {"tls-cluster": "yes",
                                             "cluster-secret-file": str(secret),
                                             "cluster-node-timeout": 3000}))
             for i in range(3)]
    try:
        for n in nodes:
            n.start()
        form_cluster(nodes, wait_s)
        # the bus speaks TLS only: a plain handshake gets no frame back
        with socket.create_connection(("127.0.0.1", nodes[0].port + 10000), timeout=10) as s:
            s.sendall(frames.encode(K_HANDSHAKE, {"proto": 1, "id": "e" * 40, "port": 1}))
            try:
                answer = s.recv(100)
            except ConnectionResetError:
                answer = b""
            assert not answer.startswith(b"DQ")
        a, b, c = (n.client(protocol=2, socket_timeout=20) for n in nodes)
        q = unique_queue()
        jid = a.execute_command("ADDJOB", q, "replicated over TLS", 10000, "REPLICATE", 3)
        assert all(len(x.execute_command("SHOW", jid)) > 0 for x in (a, b, c))
        # federation: a consumer on C gets a job queued on A
        fq = unique_queue("fed")
        a.execute_command("ADDJOB", fq, "federated", 10000, "REPLICATE", 1)
        got = c.execute_command("GETJOB", "TIMEOUT", 15000, "FROM", fq)
        assert got is not None and got[0][2] == b"federated"
        assert c.execute_command("ACKJOB", got[0][1]) == 1
        # an ACK on one node garbage-collects every copy (SETACK/DELJOB over TLS)
        assert a.execute_command("ACKJOB", jid) == 1
        wait_until(lambda: all(not x.execute_command("SHOW", jid) for x in (a, b, c)), wait_s,
                   "acked job collected on every node")
        for x in (a, b, c):
            x.close()
        for n in nodes:
            assert "Traceback" not in n.log_text()
    finally:
        for n in nodes:
            n.stop()


def test_http_endpoint_serves_https_with_the_node_certificate(tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    pki = make_pki(tmp_path / "pki")
    http_port = free_port()
    with NodeProc(tmp_path / "n", workers=2,
                  conf=tls_conf(pki, extra={"http-port": http_port})) as node:
        q = unique_queue()
        node.client(protocol=2).execute_command("ADDJOB", q, "x", 0)
        ctx = ssl.create_default_context(cafile=pki["ca.crt"])
        ctx.check_hostname = False
        url = f"https://127.0.0.1:{http_port}/metrics"
        with urllib.request.urlopen(url, context=ctx, timeout=20) as resp:
            assert resp.status == 200
            assert b"disque_" in resp.read()
        # plain HTTP on the same port is not served
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10).read()
        assert "Traceback" not in node.log_text()
