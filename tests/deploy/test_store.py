"""The models store on its own (serve.store): generations, compare-and-swap between processes, the roll-back
history and its cap, checked bytes, and finding a compare verdict. Plain files stand for bundles: the store
never opens them as models."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from defectdet.serve import store
from defectdet.serve.store import (
    Entry,
    ModelStore,
    StaleGeneration,
    StoreError,
    compare_verdict,
    file_sha256,
)


def _bundles(folder: Path, *names: str) -> dict[str, Path]:
    folder.mkdir(exist_ok=True)
    paths = {}
    for name in names:
        paths[name] = folder / f"{name}.onnx"
        paths[name].write_bytes(f"stands for bundle {name}".encode())
    return paths


def test_generations_stack_up_and_roll_back_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "RECENT_S", 0.0)
    models = tmp_path / "models"
    files = _bundles(models, "A", "B", "C", "D")
    line = ModelStore(models / "store", keep=2)
    assert line.current() is None
    entries = {name: line.stage(path) for name, path in files.items()}
    assert line.commit(0, "start", entries["A"])["generation"] == 1
    for base, name in enumerate("BCD", start=1):
        record = line.commit(base, "promote", entries[name], by="anna")
        assert record["generation"] == base + 1 and record["live"]["sha256"] == entries[name].sha256
    current = line.current()
    assert current is not None
    assert [item["name"] for item in current["stack"]] == ["C.onnx", "B.onnx"]  # capped at 2: A fell off
    assert sorted(path.name for path in line.bundles.iterdir()) == sorted(
        entries[name].file for name in "BCD"
    )
    with pytest.raises(StaleGeneration, match="generation 4 is live \\(D.onnx.*based on generation 3"):
        line.commit(3, "promote", entries["A"])
    with pytest.raises(StoreError, match="nothing to roll back to"):
        line.commit(4, "rollback", entries["B"])  # not the newest model behind the live one
    assert line.commit(4, "rollback", entries["C"])["stack"] == [entries["B"].to_dict()]
    assert line.commit(5, "rollback", entries["B"])["stack"] == []
    assert [record["action"] for record in line.history()] == ["rollback"] * 2 + ["promote"] * 3 + ["start"]
    log = [json.loads(row) for row in (models / "promotions.jsonl").read_text().splitlines()]
    assert [row["action"] for row in log] == ["promote"] * 3 + ["rollback"] * 2


def test_a_copy_is_read_once_and_checked_before_it_is_used(tmp_path: Path) -> None:
    files = _bundles(tmp_path / "models", "A")
    line = ModelStore(tmp_path / "models" / "store")
    entry = line.stage(files["A"], "A.onnx")
    files["A"].write_bytes(b"replaced after it was staged")
    assert file_sha256(line.verified(entry)) == entry.sha256  # the copy holds the bytes that were read
    line.path(entry).write_bytes(b"tampered")
    with pytest.raises(StoreError, match="the store names"):
        line.verified(entry)
    with pytest.raises(StoreError, match="not a generation record"):
        (line.root / "current").write_text("{")
        line.current()


def _race(root: str, entry: dict, start, results) -> None:  # noqa: ANN001 - multiprocessing arguments
    start.wait()
    try:
        results.put(ModelStore(root).commit(1, "promote", Entry(**entry))["generation"])
    except StaleGeneration as error:
        results.put(str(error))


def test_two_processes_promoting_from_one_generation_one_wins(tmp_path: Path) -> None:
    files = _bundles(tmp_path / "models", "A", "B", "C")
    line = ModelStore(tmp_path / "models" / "store")
    entries = {name: line.stage(path) for name, path in files.items()}
    line.commit(0, "start", entries["A"])
    context = multiprocessing.get_context("fork")
    start, results = context.Event(), context.Queue()
    racers = [
        context.Process(target=_race, args=(str(line.root), entries[name].to_dict(), start, results))
        for name in "BC"
    ]
    for racer in racers:
        racer.start()
    start.set()
    outcomes = [results.get(timeout=30) for _ in racers]
    for racer in racers:
        racer.join(10)
    assert sorted(outcomes, key=str)[0] == 2  # one wrote generation 2
    assert "generation 2 is live" in str(sorted(outcomes, key=str)[1])  # the other was refused
    assert line.current()["generation"] == 2  # type: ignore[index]


def _figures(map50: float, missed: float, escape: float = 0.0, false_call: float = 0.0) -> dict:
    """One model's figures as compare.json records them (the ones the promotion rule reads)."""
    return {
        "mAP50": map50,
        "escapes": {"escape_rate": escape, "missed_defect_rate": missed},
        "false_calls": {"false_call_rate": false_call},
    }


def _compare_document(old: dict, new: dict, decision: str) -> dict:
    from defectdet.runtime.compare_rule import Tolerances, decide

    verdict = decide(old, new, Tolerances())
    tolerances = verdict["tolerances"]
    return {
        "models": {"old": old, "new": new},
        "verdict": {**verdict, "decision": decision, "tolerances": tolerances},
    }


def test_the_compare_verdict_is_found_by_the_pair_of_hashes(tmp_path: Path) -> None:
    models = tmp_path / "models"
    files = _bundles(models, "old", "new")
    sha = {name: file_sha256(path) for name, path in files.items()}
    (models / "runs" / "v2").mkdir(parents=True)
    document = _compare_document(_figures(0.80, 0.10), _figures(0.85, 0.05), "promote")
    document["models"]["old"]["sha256"] = sha["old"]
    document["models"]["new"]["bundle"] = str(files["new"])  # no sha: hashed
    (models / "runs" / "v2" / "compare.json").write_text(json.dumps(document))
    (models / "compare.json").write_text("{not json")  # skipped
    found = compare_verdict(models, sha["old"], sha["new"])
    assert found is not None and found["decision"] == "promote" and found["file"] == "runs/v2/compare.json"
    assert found["reasons"][0].startswith("escape rate: NEW 0.0000 <=")
    assert compare_verdict(models, sha["new"], sha["old"]) is None  # the other direction is another question


def _one_verdict(tmp_path: Path, document: dict) -> dict:
    models = tmp_path / "models"
    files = _bundles(models, "old", "new")
    sha = {name: file_sha256(path) for name, path in files.items()}
    for role in ("old", "new"):
        document["models"].setdefault(role, {})["sha256"] = sha[role]
    (models / "compare.json").write_text(json.dumps(document))
    found = compare_verdict(models, sha["old"], sha["new"])
    assert found is not None
    return found


def test_a_hand_edited_verdict_is_not_trusted(tmp_path: Path) -> None:
    """The figures say NEW escapes more (keep); the decision was edited to promote, the reasons left as they
    were: the rule applied again to the figures answers keep and says the file does not hold together."""
    document = _compare_document(_figures(0.80, 0.10), _figures(0.80, 0.10, escape=0.2), "promote")
    assert document["verdict"]["reasons"][0].startswith("escape rate: NEW 0.2000 >")
    found = _one_verdict(tmp_path, document)
    assert found["decision"] == "keep OLD" and found["recorded_decision"] == "promote"
    assert "the recorded verdict 'promote' does not follow from the recorded figures" in found["reasons"][0]
    assert found["reasons"][1].startswith("escape rate: NEW 0.2000 >")


def test_a_verdict_without_figures_is_not_trusted(tmp_path: Path) -> None:
    document = {"models": {}, "verdict": {"decision": "promote", "reasons": ["mAP@0.5: within the limit"]}}
    found = _one_verdict(tmp_path, document)
    assert found["decision"] == "keep OLD" and "cannot be checked" in found["reasons"][0]


def test_a_near_zero_new_model_is_never_promoted_by_a_recorded_verdict(tmp_path: Path) -> None:
    """Both models find nothing (mAP 0, every defect missed): 'equal is not worse' made an older compare write
    promote; the gate applies the rule again and refuses, naming the near-zero figures."""
    zero = _figures(0.0, 1.0, escape=1.0)
    document = _compare_document(zero, dict(zero), "promote")
    found = _one_verdict(tmp_path, document)
    assert found["decision"] == "keep OLD"
    assert any("NEW finds almost none of the labelled defects" in reason for reason in found["reasons"])
