"""A local SparkSession set up for the data source (tests, examples)."""

from __future__ import annotations

from typing import Any

from disque_mp.spark.source import register


def find_java17_home() -> str | None:
    """JAVA_HOME if it holds a Java 17, else the first JDK 17 under /usr/lib/jvm."""
    import glob
    import os

    current = os.environ.get("JAVA_HOME")
    if current and "17" in current and os.path.exists(os.path.join(current, "bin", "java")):
        return current
    for home in sorted(glob.glob("/usr/lib/jvm/*17*")):
        if os.path.exists(os.path.join(home, "bin", "java")):
            return home
    return current


def local_session(app_name: str = "disque-mp", cores: int = 2, **conf: str) -> Any:
    """A local SparkSession set up as docs/client-spark.md ("PySpark facts") advises,
    with the ``disque`` format registered. Call before any other Spark code."""
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers need pyarrow and disque_mp
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    java_home = find_java17_home()
    if java_home:
        os.environ["JAVA_HOME"] = java_home
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.sql.shuffle.partitions": str(cores),
        "spark.driver.memory": "1g",
        **conf,
    }
    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session
