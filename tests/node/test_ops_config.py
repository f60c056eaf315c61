"""requirepass-file and the operator-side directives, in memory (no node)."""

from __future__ import annotations

from pathlib import Path

import pytest

from disque_mp.node import config as c


def test_requirepass_file_sets_the_password_and_stays_out_of_a_rewrite(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("from-a-file-password\nignored second line\n")
    conf = tmp_path / "disque.conf"
    conf.write_text(f"port 7711\nrequirepass-file {pw}\n")
    cfg = c.load(str(conf))
    assert cfg.requirepass == "from-a-file-password"
    c.rewrite(cfg)
    assert "from-a-file-password" not in conf.read_text()
    for text, why in (("", "holds no password"), ("x" * 5000, "larger than")):
        pw.write_text(text)
        with pytest.raises(c.ConfigError, match=why):
            c.load(str(conf))
    with pytest.raises(c.ConfigError, match="Can't read requirepass-file"):
        c.load(None, [["requirepass-file", str(tmp_path / "missing")]])


def test_config_set_dir_refused_under_the_aof_and_for_a_loose_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = c.Config(dir=str(tmp_path), appendonly=True)
    (tmp_path / "other").mkdir(mode=0o700)
    err = c.config_set(cfg, "dir", str(tmp_path / "other"))
    assert err is not None and "while appendonly is yes" in err
    assert c.config_set(cfg, "dir", str(tmp_path)) is None  # the same dir is fine
    cfg.appendonly = False
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    err = c.config_set(cfg, "dir", str(loose))
    assert err is not None and "mkdir -m 700" in err and "chmod" not in err
    assert c.config_set(cfg, "dir", str(tmp_path / "other")) is None
