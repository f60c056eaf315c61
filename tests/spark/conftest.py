"""One local[2] SparkSession for every Spark test, and one real disque-mp node.

Settings from docs/client-spark.md, "PySpark facts" (applied by
``disque_mp.spark.local_session``): workers run this interpreter
(PYSPARK_PYTHON), loopback only, Java 17, no UI.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from tests.nodeproc import NodeProc  # noqa: E402


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from disque_mp.spark import find_java17_home, local_session

    if find_java17_home() is None and shutil.which("java") is None:
        pytest.skip("no Java runtime (make sysdeps installs openjdk-17)")
    session = local_session("disque-mp-tests", cores=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with NodeProc(Path(tmp_path_factory.mktemp("spark-node")), workers=2) as proc:
        yield proc
