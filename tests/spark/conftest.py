"""One local[2] SparkSession for every Spark test, and one real disque-mp node.

Settings from ../shared/notes/pyspark-datasource.md: workers must run this
interpreter (PYSPARK_PYTHON), loopback only, Java 17, no UI.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from tests.nodeproc import NodeProc  # noqa: E402

pytestmark = pytest.mark.spark


def _java17_home() -> str | None:
    """A JDK 17 home: JAVA_HOME if it is one, else the first one installed."""
    current = os.environ.get("JAVA_HOME")
    if current and "17" in current and os.path.exists(os.path.join(current, "bin", "java")):
        return current
    for home in sorted(glob.glob("/usr/lib/jvm/*17*")):
        if os.path.exists(os.path.join(home, "bin", "java")):
            return home
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    home = _java17_home()
    if home is None and shutil.which("java") is None:
        pytest.skip("no Java runtime (make sysdeps installs openjdk-17)")
    if home is not None:
        os.environ["JAVA_HOME"] = home
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from disque_mp.spark import DisqueDataSource

    session = (
        SparkSession.builder.master("local[2]")
        .appName("disque-mp-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(DisqueDataSource)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with NodeProc(Path(tmp_path_factory.mktemp("spark-node")), workers=2) as proc:
        yield proc
