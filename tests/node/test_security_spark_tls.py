"""The Spark source's TLS options reach a real node's tls-port: the clients every
part of the source makes (planning check, writer, snapshot reader, stream) come
from ``Options.client``, which carries them; HELLO on the TLS port lists TLS
ports, so a TLS client fails over (and fans out) to TLS ports."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.node.test_tls import make_pki, tls_conf
from tests.nodeproc import NodeProc, free_port, unique_queue

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("openssl") is None,
                                 reason="the openssl CLI is needed to make test certificates")]


def test_spark_options_connect_over_tls(tmp_path: Path) -> None:
    spark = pytest.importorskip("disque_mp.spark")
    pki = make_pki(tmp_path / "pki")
    tls_port = free_port()
    with NodeProc(tmp_path / "n", workers=2, conf=tls_conf(pki, tls_port)):
        q = unique_queue()
        opts = spark.parse_options({
            "nodes": f"127.0.0.1:{tls_port}", "queue": q, "tls": "true",
            "tls_ca_cert_file": pki["ca.crt"], "tls_cert_file": pki["client.crt"],
            "tls_key_file": pki["client.key"]})
        spark.check_reachable(opts)  # the driver's planning check, over TLS
        client = opts.client()
        try:  # HELLO over TLS lists the TLS port, where failover must go
            assert [n.port for n in client.hello().nodes] == [tls_port]
            assert client.add_job(q, b"over tls").startswith("D-")
            assert spark.queued_in_cluster(client, [q], opts) == 1
        finally:
            client.close()
        rows = list(spark.snapshot_rows(opts))
        assert len(rows) == 1
        plain = spark.parse_options({"nodes": f"127.0.0.1:{tls_port}", "queue": q})
        with pytest.raises(Exception):  # noqa: B017 - without TLS the node is not reached
            spark.check_reachable(plain)
