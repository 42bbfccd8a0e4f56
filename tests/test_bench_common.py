"""bench/common.py: what a result file records about the code that made it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import common

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def changed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BENCH_GIT_COMMIT", raising=False)
    porcelain = " M bench/pretrain.py\n M src/defectdet/model/weights/nano_plain.pt\n"
    monkeypatch.setattr(common, "_git", lambda *args: porcelain)


def test_uncommitted_code_lists_changed_tracked_files(changed: None) -> None:
    assert common.uncommitted_code() == ["bench/pretrain.py", "src/defectdet/model/weights/nano_plain.pt"]


def test_files_the_bench_wrote_are_not_uncommitted_code(changed: None) -> None:
    weights = ROOT / "src/defectdet/model/weights/nano_plain.pt"
    assert common.uncommitted_code(produced=[weights]) == ["bench/pretrain.py"]


def test_a_named_commit_leaves_the_check_to_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_GIT_COMMIT", "abc1234")
    assert common.uncommitted_code() is None
    assert common.git_commit() == "abc1234"
