"""Power loss of a whole cluster (tests/faults/power_loss.py): kill -9 of every
process of every node of a 3-node cluster at once under load, every AOF cut to
what its last fdatasync made durable, restart. With ``appendfsync always`` no
job whose ADDJOB was answered is lost. (``everysec``'s window is measured by the
script, not asserted: docs/operations.md, "Power loss".)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.power_loss import run

pytestmark = pytest.mark.integration

load_s = 3.0


def test_appendfsync_always_loses_no_answered_job(tmp_path: Path) -> None:
    out = run(tmp_path, "always", load_s)
    assert out.answered > 0, "the load ran"
    assert not out.lost, f"{out.line()}; first lost: {out.lost[:3]}"
