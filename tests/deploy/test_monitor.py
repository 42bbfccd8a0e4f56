"""Drift monitor: image statistics, reference profile, EWMA limits and the alert / no-alert behaviour."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import cv2
import numpy as np
import pytest

from defectdet.errors import InputError
from defectdet.runtime.monitor import (
    GEOMETRY,
    STATISTICS,
    DriftMonitor,
    build_reference,
    degenerate_reason,
    ewma_limit,
    ewma_run_length,
    group_inflation,
    group_spread,
    image_statistics,
    reference_groups,
    sample_reference,
)


def _board(rng: np.random.Generator, size: int = 640) -> np.ndarray:
    """A synthetic near-binary 'board': dark background, bright random rectangles, a little noise."""
    image = np.full((size, size), 30, np.uint8)
    for _ in range(40):
        x, y = rng.integers(0, size - 40, 2)
        w, h = rng.integers(10, 120, 2)
        image[y : y + h, x : x + w] = 220
    noise = rng.normal(0, 4, image.shape)
    return np.clip(image + noise, 0, 255).astype(np.uint8)


def test_image_statistics_values() -> None:
    flat = np.full((64, 64), 100, np.uint8)
    stats = image_statistics(flat)
    assert set(stats) == set(STATISTICS) | set(GEOMETRY)
    assert stats["brightness"] == pytest.approx(100)
    assert stats["contrast"] == pytest.approx(0)
    assert stats["sharpness"] == pytest.approx(0)
    assert stats["saturation"] == 0
    half = np.zeros((64, 64), np.uint8)
    half[:, 32:] = 255
    stats = image_statistics(half)
    assert stats["brightness"] == pytest.approx(127.5)
    assert stats["contrast"] == pytest.approx(127.5)
    assert stats["saturation"] == 1.0
    assert stats["sharpness"] > 0 and stats["detail"] > 0 and stats["acutance"] > 0


def test_image_statistics_respond_to_faults() -> None:
    image = _board(np.random.default_rng(0))
    base = image_statistics(image)
    blurred = image_statistics(cv2.GaussianBlur(image, (0, 0), 2))
    assert blurred["sharpness"] < 0.2 * base["sharpness"]
    low = image_statistics(((image.astype(np.float32) - 128) * 0.5 + 128).astype(np.uint8))
    assert low["contrast"] == pytest.approx(0.5 * base["contrast"], rel=0.02)
    assert blurred["acutance"] < 0.7 * base["acutance"]
    # a smudge: part of the field blurred; global sharpness moves little, the softest tile's acutance a lot
    smudged = image.copy()
    smudged[:320, :320] = cv2.GaussianBlur(image, (0, 0), 3)[:320, :320]
    local = image_statistics(smudged)
    assert local["acutance"] < 0.7 * base["acutance"]
    assert local["acutance"] / base["acutance"] < local["detail"] / base["detail"]
    dark = image_statistics((image * 0.7).astype(np.uint8))
    assert dark["brightness"] == pytest.approx(0.7 * base["brightness"], rel=0.02)


def test_image_statistics_rgb_and_bad_input() -> None:
    gray = _board(np.random.default_rng(1), 128)
    rgb = np.repeat(gray[:, :, None], 3, axis=2)
    assert image_statistics(rgb)["brightness"] == pytest.approx(image_statistics(gray)["brightness"], abs=0.5)
    assert image_statistics(gray[:, :, None]) == image_statistics(gray)
    assert image_statistics(gray[::2, ::2])["brightness"] > 0  # non-contiguous view
    with pytest.raises(InputError, match="uint8"):
        image_statistics(gray.astype(np.float32))
    with pytest.raises(InputError, match="shape"):
        image_statistics(np.zeros((0, 5), np.uint8))


def test_build_reference_is_json_and_correct() -> None:
    rng = np.random.default_rng(3)
    stats = [image_statistics(_board(rng, 128)) for _ in range(20)]
    features = rng.normal(2.0, 0.5, (20, 8)).astype(np.float32)
    features[:, 3] = 1.0  # a dead channel
    reference = build_reference(stats, features)
    round_trip = json.loads(json.dumps(reference))
    assert round_trip == reference
    brightness = np.array([row["brightness"] for row in stats])
    assert reference["images"] == 20
    assert reference["statistics"]["brightness"]["mean"] == pytest.approx(brightness.mean())
    assert reference["statistics"]["brightness"]["std"] == pytest.approx(brightness.std(ddof=1))
    assert reference["statistics"]["brightness"]["quantiles"]["0.5"] == pytest.approx(np.median(brightness))
    assert reference["features"]["channels"] == 8
    assert reference["features"]["std"][3] == 0
    assert 0.3 < reference["features"]["score"]["mean"] < 1.5  # mean |z| of normal data is ~0.8
    assert build_reference(stats, None)["features"] is None
    with pytest.raises(ValueError, match="features"):
        build_reference(stats, features[:5])
    with pytest.raises(ValueError, match="at least one"):
        build_reference([], None)


def _draw_stats(rng: np.random.Generator) -> dict[str, float]:
    return {
        "brightness": rng.normal(120, 10),
        "contrast": rng.normal(60, 5),
        "sharpness": rng.normal(2000, 200),
        "saturation": rng.uniform(0.0, 0.02),
        "detail": rng.normal(8, 0.8),
        "acutance": rng.normal(0.6, 0.03),
    }


def _reference(rng: np.random.Generator, images: int = 200, channels: int = 16) -> dict:
    stats = [_draw_stats(rng) for _ in range(images)]
    return build_reference(stats, rng.normal(1.0, 0.2, (images, channels)))


def test_ewma_limit_matches_published_run_length() -> None:
    # Lucas & Saccucci (1990): lambda 0.1, L = 2.814 gives an in-control ARL of 500
    h = 2.814 * np.sqrt(0.1 / 1.9)
    assert ewma_run_length(0.1, h) == pytest.approx(500, rel=0.02)
    assert ewma_limit(0.1, 500) == pytest.approx(h, rel=0.01)
    assert ewma_limit(0.2, 1e6) > ewma_limit(0.2, 1e4)


def test_monitor_stays_ok_on_reference_like_data() -> None:
    rng = np.random.default_rng(4)
    monitor = DriftMonitor(_reference(rng))
    assert monitor.charts == [
        "brightness",
        "contrast",
        "sharpness",
        "saturation",
        "detail",
        "acutance",
        "features",
    ]
    levels = set()
    for index in range(2000):
        stats = _draw_stats(rng)
        state = monitor.update(stats, rng.normal(1.0, 0.2, 16))
        levels.add(state.level)
        assert state.images == index + 1
    assert levels == {"ok"}
    assert state.statistic in monitor.charts and state.band[0] < state.band[1]
    json.dumps(state.to_dict())


def test_monitor_alerts_on_contrast_drop_and_names_it(caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(6)
    monitor = DriftMonitor(_reference(rng))
    base = {
        "brightness": 120.0,
        "contrast": 60.0,
        "sharpness": 2000.0,
        "saturation": 0.01,
        "detail": 8.0,
        "acutance": 0.6,
    }
    for _ in range(50):
        assert monitor.update(base, rng.normal(1.0, 0.2, 16)).level == "ok"
    caplog.set_level("INFO", logger="defectdet.runtime.monitor")
    images_to_alert = None
    for index in range(1, 40):
        state = monitor.update({**base, "contrast": 30.0}, rng.normal(1.0, 0.2, 16))
        if state.level == "alert":
            images_to_alert = index
            break
    assert images_to_alert is not None and images_to_alert <= 10
    assert state.statistic == "contrast"
    assert state.value < state.band[0]
    assert "contrast" in state.message and "outside" in state.message
    assert state.charts["contrast"].level == "alert" and state.charts["brightness"].level == "ok"
    for _ in range(20):  # staying in alert logs nothing more
        monitor.update({**base, "contrast": 30.0}, rng.normal(1.0, 0.2, 16))
    changes = [record for record in caplog.records if "drift" in record.getMessage()]
    assert len(changes) == len({record.getMessage().split(" after")[0] for record in changes}) <= 2
    assert changes[-1].levelname == "WARNING" and "-> alert" in changes[-1].getMessage()
    for _ in range(60):  # fault removed: the chart comes back
        state = monitor.update(base, rng.normal(1.0, 0.2, 16))
    assert state.level == "ok"
    monitor.reset()
    assert monitor.state().images == 0 and monitor.history() == []


def test_monitor_feature_chart_alerts_on_activation_shift() -> None:
    rng = np.random.default_rng(7)
    monitor = DriftMonitor(_reference(rng), statistics=["brightness", "features"])
    assert monitor.charts == ["brightness", "features"]
    assert monitor.limits()["features"]["two_sided"] is False
    fed = 0
    while fed < 40 and monitor.state().level != "alert":
        state = monitor.update({"brightness": 120.0}, rng.normal(1.6, 0.2, 16))
        fed += 1
    assert state.level == "alert" and state.statistic == "features" and fed <= 10
    assert "features" in state.message and "above" in state.message
    assert len(monitor.history()) == fed
    as_json = json.loads(json.dumps(state.to_dict(), allow_nan=False))  # strict JSON: the open side is null
    assert as_json["band"][0] is None and as_json["charts"]["features"]["alert_band"][0] is None


def test_monitor_skips_binarised_saturation_and_validates() -> None:
    rng = np.random.default_rng(8)
    reference = _reference(rng)
    reference["statistics"]["saturation"]["quantiles"]["0.5"] = 0.95
    monitor = DriftMonitor(reference)
    assert "saturation" not in monitor.charts and "binarised" in monitor.skipped["saturation"]
    with pytest.raises(ValueError, match="not in the reference"):
        DriftMonitor(reference, statistics=["gloss"])
    with pytest.raises(ValueError, match="reference profile"):
        DriftMonitor({})


def test_monitor_is_thread_safe() -> None:
    rng = np.random.default_rng(9)
    monitor = DriftMonitor(_reference(rng))
    base = {
        "brightness": 120.0,
        "contrast": 60.0,
        "sharpness": 2000.0,
        "saturation": 0.01,
        "detail": 8.0,
        "acutance": 0.6,
    }

    def feed() -> None:
        for _ in range(250):
            monitor.update(base, np.ones(16))

    threads = [threading.Thread(target=feed) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert monitor.state().images == 1000


def test_quantile_transform_symmetrises_a_skewed_statistic() -> None:
    rng = np.random.default_rng(10)
    skewed = rng.lognormal(0.0, 0.6, 500)
    stats = [{"gloss": float(value)} for value in skewed]  # no absolute scale floor for this name
    monitor = DriftMonitor(build_reference(stats, None))
    chart = monitor._charts["gloss"]
    median = float(np.median(skewed))
    assert chart.standardizer.forward(median) == pytest.approx(0.0, abs=1e-9)
    assert chart.standardizer.forward(float(np.quantile(skewed, 0.95))) == pytest.approx(1.645, abs=0.01)
    for value in (0.1, median, 3.0, 40.0):
        assert chart.standardizer.inverse(chart.standardizer.forward(value)) == pytest.approx(value)
    low, high = chart.band(chart.alert_limit)
    assert low < median < high and high - median > median - low  # the band follows the skew
    linear = DriftMonitor(build_reference(stats, None), transform="linear")._charts["gloss"]
    assert linear.standardizer.forward(float(skewed.mean())) == pytest.approx(0.0)


# ----------------------------------------------------------------------------------------------------
# Reference from many board groups (issue 23, item 8): unseen boards stay quiet, faults still alert
# ----------------------------------------------------------------------------------------------------


def _group_board(rng: np.random.Generator, rects: int, size: int = 128) -> np.ndarray:
    """A binarised-looking board whose copper share (so brightness, contrast, sharpness) follows `rects`."""
    image = np.full((size, size), 30, np.uint8)
    for _ in range(rects):
        x, y = rng.integers(0, size - 24, 2)
        w, h = rng.integers(6, 24, 2)
        image[y : y + h, x : x + w] = 220
    return np.clip(image + rng.normal(0, 4, image.shape), 0, 255).astype(np.uint8)


def _group(rng: np.random.Generator, rects: int, images: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Boards of one design family (copper count rects +-4) and features with the group's own offset."""
    boards = [_group_board(rng, int(rng.integers(rects - 4, rects + 5))) for _ in range(images)]
    return boards, rng.normal(1.0, 0.3, 16) + rng.normal(0, 0.2, (images, 16))


def _first_alert(
    monitor: DriftMonitor, boards: list[np.ndarray], features: np.ndarray, fault=None
) -> int | None:  # noqa: ANN001
    for index, (image, vector) in enumerate(zip(boards, features, strict=True), 1):
        state = monitor.update(image_statistics(fault(image) if fault else image), vector)
        if state.level == "alert":
            return index
    return None


@pytest.fixture(scope="module")
def grouped_reference() -> tuple[dict, dict, list[np.ndarray], np.ndarray]:
    """(reference with groups, the same images without groups, an unseen group's boards and features)."""
    rng = np.random.default_rng(23)
    stats, features, labels = [], [], []
    for group, rects in enumerate((15, 30, 45, 60, 75)):
        boards, vectors = _group(rng, rects, 40)
        stats += [image_statistics(board) for board in boards]
        features.append(vectors)
        labels += [f"group{group}"] * len(boards)
    grouped = build_reference(stats, np.concatenate(features), groups=labels, group_by="test")
    plain = build_reference(stats, np.concatenate(features))
    unseen = _group(rng, 85, 150)  # a new design, a little denser than any reference group
    return grouped, plain, *unseen


def test_reference_records_between_group_spread(grouped_reference: tuple) -> None:
    grouped, plain, _, _ = grouped_reference
    assert grouped["groups"] == {"count": 5, "by": "test", "images": {f"group{g}": 40 for g in range(5)}}
    brightness = grouped["statistics"]["brightness"]
    assert brightness["between_std"] > brightness["within_std"] > 0  # designs differ more than boards
    assert plain["statistics"]["brightness"]["between_std"] == 0
    assert grouped["features"]["score_held_out"] and not plain["features"]["score_held_out"]
    assert (
        grouped["features"]["score"]["mean"] > plain["features"]["score"]["mean"]
    )  # unseen groups score higher
    limits = DriftMonitor(grouped).limits()
    assert 2.0 < limits["brightness"]["group_inflation"] <= 3.0  # at most sqrt((2 - lam) / lam)
    assert all(value["group_inflation"] == 1.0 for value in DriftMonitor(plain).limits().values())
    assert json.loads(json.dumps(grouped)) == grouped


def test_unseen_board_group_stays_quiet_while_faults_alert(grouped_reference: tuple) -> None:
    grouped, plain, boards, features = grouped_reference
    # without the spread the new design alone looks like drift (the old false alarm) ...
    assert _first_alert(DriftMonitor(plain), boards, features) is not None
    # ... with it, 150 clean boards of the unseen group raise no alert
    assert _first_alert(DriftMonitor(grouped), boards, features) is None

    def half_contrast(image: np.ndarray) -> np.ndarray:
        mean = float(image.mean())
        return np.clip((image.astype(np.float32) - mean) * 0.5 + mean, 0, 255).astype(np.uint8)

    def dark(image: np.ndarray) -> np.ndarray:
        return (image.astype(np.float32) * 0.7).astype(np.uint8)

    for fault in (half_contrast, dark, lambda image: cv2.GaussianBlur(image, (0, 0), 2)):
        delay = _first_alert(DriftMonitor(grouped), boards, features, fault)
        assert delay is not None and delay <= 30


def test_degenerate_images_are_skipped_and_counted(grouped_reference: tuple) -> None:
    grouped, _, boards, features = grouped_reference
    speck = image_statistics(np.full((1, 1), 200, np.uint8))
    strip = image_statistics(np.tile(boards[0][:1], (2, 1)))  # 128 x 2
    constant = image_statistics(np.full((128, 128), 90, np.uint8))
    assert degenerate_reason(speck)[0] == degenerate_reason(strip)[0] == "too small"
    assert degenerate_reason(constant)[0] == "constant"
    assert degenerate_reason(image_statistics(boards[0])) is None
    monitor = DriftMonitor(grouped)
    monitor.update(image_statistics(boards[0]), features[0])
    before = {name: chart.ewma for name, chart in monitor._charts.items()}
    for stats in [speck, strip, constant] * 20:
        state = monitor.update(stats, features[0])
    assert state.level == "ok" and state.images == 1
    assert {name: chart.ewma for name, chart in monitor._charts.items()} == before
    assert state.skipped_images == 60 and state.skip_reasons == {"too small": 40, "constant": 20}
    assert "constant" in state.last_skip and "60 degenerate" in state.message
    assert monitor.update(image_statistics(boards[1]), features[1]).last_skip is None
    as_json = state.to_dict()
    assert as_json["skipped_images"] == 60 and as_json["skip_reasons"]["constant"] == 20
    monitor.reset()
    assert monitor.state().skipped_images == 0
    # the reference builder drops them too
    clean = [image_statistics(board) for board in boards[:10]]
    reference = build_reference([*clean, speck, constant], features[:12])
    assert reference["images"] == 10 and reference["skipped"] == 2
    with pytest.raises(ValueError, match="non-degenerate"):
        build_reference([speck, constant], None)


def test_reference_groups_and_bounded_sample() -> None:
    deeppcb = [Path(f"root/group{g}/{g}/{g}{i:03d}_test.jpg") for g in ("13000", "20085") for i in range(5)]
    labels, how = reference_groups(deeppcb)
    assert how == "parent folder" and sorted(set(labels)) == ["group13000/13000", "group20085/20085"]
    flat = [Path(f"images/{name}_{i:03d}.png") for name in ("boardA", "boardB", "boardC") for i in range(4)]
    labels, how = reference_groups(flat)
    assert how == "file-name prefix" and labels[:5] == ["boardA"] * 4 + ["boardB"]
    plain = [Path(f"images/{i:05d}.png") for i in range(40)]
    labels, how = reference_groups(plain, chunks=8)
    assert "8 runs" in how and len(set(labels)) == 8 and labels[:5] == ["chunk0"] * 5
    assert reference_groups([Path("a.png"), Path("b.png")])[0] == ["chunk0", "chunk0"]

    groups = ["big"] * 300 + ["small"] * 10 + ["mid"] * 50
    chosen = sample_reference(groups, 60, seed=1)
    assert len(chosen) == 60 and chosen == sorted(chosen) == sample_reference(groups, 60, seed=1)
    assert Counter(groups[i] for i in chosen) == {"big": 25, "small": 10, "mid": 25}
    assert sample_reference(groups, 1000) == list(range(len(groups)))


def test_group_spread_matches_anova() -> None:
    rng = np.random.default_rng(5)
    offsets = rng.normal(0, 3.0, 40)
    values = np.concatenate([offset + rng.normal(0, 1.0, 25) for offset in offsets])
    labels = [f"g{g}" for g in range(40) for _ in range(25)]
    within, between, upper = group_spread(values, labels)
    assert within == pytest.approx(1.0, rel=0.1) and between == pytest.approx(3.0, rel=0.25)
    assert between < upper < 1.3 * between  # 40 groups: a tight bound
    few = group_spread(values[:125], labels[:125])  # 5 groups: the bound allows for much more
    assert few[2] > 1.4 * few[1]
    assert group_spread(values, ["one"] * len(values))[1:] == (0.0, 0.0)
    assert group_inflation({"within_std": 1.0, "between_std": 0.1, "between_std_upper": 2.0}, 0.2) > 2.5
    assert group_inflation({"within_std": 1.0, "between_std": 0.0}, 0.2) == 1.0
    assert group_inflation({"within_std": 0.0, "between_std": 2.0}, 0.2) == pytest.approx(3.0)
    assert group_inflation({}, 0.2) == 1.0  # a format-1 reference: unchanged


def test_binarised_reference_charts_levels_not_copper_share() -> None:
    rng = np.random.default_rng(12)
    boards = [np.where(_group_board(rng, rects) > 128, 255, 0).astype(np.uint8) for rects in range(10, 90, 2)]
    stats = [image_statistics(board) for board in boards]
    monitor = DriftMonitor(build_reference(stats, None, groups=[str(i // 8) for i in range(len(stats))]))
    assert {"saturation", "brightness", "contrast"} <= set(monitor.skipped)
    assert "copper" in monitor.skipped["contrast"]
    assert {"black_level", "white_level", "acutance"} <= set(monitor.charts)
    dimmer = [image_statistics((board * 0.7).astype(np.uint8)) for board in boards[:30]]
    states = [monitor.update(stats) for stats in dimmer]
    assert states[-1].level == "alert" and states[-1].statistic == "white_level"
    older = build_reference([{k: v for k, v in row.items() if "level" not in k} for row in stats], None)
    assert "contrast" in DriftMonitor(older).charts  # a reference without the levels keeps its charts


def test_a_level_flipping_at_a_limit_is_logged_once_and_a_fall_once_it_held(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from types import SimpleNamespace

    from defectdet.runtime.monitor import LOG_SETTLE_IMAGES

    monitor = DriftMonitor(_reference(np.random.default_rng(7)))
    caplog.set_level("INFO", logger="defectdet.runtime.monitor")
    levels = ["warn", "alert"] + ["warn", "alert"] * 20 + ["ok"] * LOG_SETTLE_IMAGES
    for index, level in enumerate(levels, 1):
        monitor._maybe_log(SimpleNamespace(level=level, images=index, message=level))
    logged = [record.getMessage().split(" after")[0] for record in caplog.records]
    assert logged == ["drift ok -> warn", "drift warn -> alert", "drift alert -> ok"]
    assert caplog.records[1].levelname == "WARNING" and caplog.records[2].levelname == "INFO"
