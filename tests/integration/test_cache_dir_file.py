"""`--cache-dir` that is a file (issue 10, item 6): one line, exit 2, before the tiny model is built."""

import pytest

from helpers.inprocess import marl_in_process

HOW = "pass --cache-dir FOLDER or set MARL_CACHE (default ~/.cache/marl)"


@pytest.mark.parametrize("command", [["demo", "--steps", "1"], ["run", "relay", "--set", "train.steps=1"],
                                     ["estimate", "relay"]])
def test_a_cache_dir_that_is_a_file_is_one_line_before_any_build(tmp_path, command, monkeypatch):
    blocker = tmp_path / "cache-file"
    blocker.write_text("keep me\n")
    out = tmp_path / "out"
    extra = ["--out", str(out)] if command[0] != "estimate" else []
    monkeypatch.delenv("MARL_CACHE", raising=False)  # only --cache-dir names the cache
    result = marl_in_process(*command, "--cache-dir", str(blocker / "sub"), *extra, env={"HOME": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"marl: error: tiny-model cache {blocker / 'sub'}: {blocker} is a file, not a folder; {HOW}"]
    assert "tiny model: building" not in result.stdout and blocker.read_text() == "keep me\n"
    assert not out.exists() or not any(out.rglob("checkpoints"))
