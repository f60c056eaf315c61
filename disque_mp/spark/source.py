"""The ``disque`` format: the ``DataSource`` Spark instantiates, handing out the
readers and writers."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from disque_mp.spark.options import SCHEMA, Options, check_reachable, parse_options, require_queues
from disque_mp.spark.reader import DisqueBatchReader
from disque_mp.spark.stream import DisqueStreamReader
from disque_mp.spark.writer import DisqueStreamWriter, DisqueWriter, write_plan


class DisqueDataSource(DataSource):
    """Format ``disque``: see the module doc for options and guarantees."""

    @classmethod
    def name(cls) -> str:
        return "disque"

    def schema(self) -> str:
        return SCHEMA

    def _opts(self) -> Options:
        return parse_options(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return DisqueWriter(write_plan(self._opts(), schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return DisqueStreamWriter(write_plan(self._opts(), schema))

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = self._opts()
        require_queues(opts, "reading")
        check_reachable(opts)
        return DisqueBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = self._opts()
        require_queues(opts, "readStream")
        check_reachable(opts)
        return DisqueStreamReader(opts)


def register(spark: Any) -> None:
    """``spark.dataSource.register(DisqueDataSource)``."""
    spark.dataSource.register(DisqueDataSource)
