"""Issue 23, item 4: a seeded, bounded fuzz of the one decode path every caller shares (`decode_image`,
`decode_pair`: the server, `predict`, `check`, training loaders).

Valid files of every accepted format are mutated (bit flips, truncation, header bytes overwritten, size
fields inflated, chunks repeated, junk appended). Each mutant must either decode to a uint8 image within
the pixel limit or raise `ImageReadError` naming the file: no other exception type, and no decoder is
ever handed a header that declares more pixels than the limit.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from defectdet.data.imageio import decode_image, decode_pair, read_image_size
from defectdet.errors import ImageReadError

LIMIT = 40 * 30  # max_pixels for the fuzz: the seeds are exactly at the limit
MUTANTS_PER_SEED = 24
SEED = 20_230


def _seeds(tmp_path: Path) -> dict[str, bytes]:
    """One small valid file per accepted format and flavour (8/16-bit, gray/colour)."""
    rng = np.random.default_rng(SEED)
    gray = cv2.GaussianBlur(rng.integers(0, 255, (30, 40), dtype=np.uint8), (3, 3), 0)
    color = cv2.merge([gray, 255 - gray, gray // 2])
    deep = gray.astype(np.uint16) * 16
    files = {
        "gray.png": gray, "color.png": color, "deep.png": deep, "gray.jpg": gray, "color.jpg": color,
        "gray.bmp": gray, "color.bmp": color, "gray.tif": gray, "deep.tif": deep, "color.tif": color,
        "color.webp": color, "gray.pgm": gray, "color.ppm": color,
    }  # fmt: skip
    seeds = {}
    for name, image in files.items():
        path = tmp_path / name
        assert cv2.imwrite(str(path), image)
        seeds[name] = path.read_bytes()
    for name, mode, kwargs in [
        ("progressive.jpg", "L", {"progressive": True}),
        ("lossy.webp", "RGB", {"quality": 80}),
        ("lzw.tif", "RGB", {"compression": "tiff_lzw"}),
        ("rle.bmp", "P", {}),
    ]:
        path = tmp_path / name
        Image.fromarray(color[:, :, ::-1]).convert(mode).save(path, **kwargs)
        seeds[name] = path.read_bytes()
    return seeds


def _foreign_seeds(tmp_path: Path) -> dict[str, bytes]:
    """Files OpenCV or Pillow can decode but the product does not accept (the probe's .hdr, DDS, SPIDER...)."""
    gray = np.random.default_rng(SEED).integers(0, 255, (30, 40), dtype=np.uint8)
    seeds = {}
    for name, image in {"radiance.hdr": np.zeros((30, 40, 3), np.float32), "sun.ras": gray}.items():
        assert cv2.imwrite(str(tmp_path / name), image)
        seeds[name] = (tmp_path / name).read_bytes()
    for name, mode in {"a.dds": "RGB", "a.spider": "F", "a.gif": "L", "a.tga": "L", "a.pcx": "L"}.items():
        Image.fromarray(gray).convert(mode).save(tmp_path / name, name.split(".")[1].upper())
        seeds[name] = (tmp_path / name).read_bytes()
    return seeds


def _mutants(data: bytes, rng: np.random.Generator) -> Iterator[tuple[str, bytes]]:
    size = len(data)
    for index in range(MUTANTS_PER_SEED):
        out = bytearray(data)
        kind = ("flip", "truncate", "header", "inflate", "repeat", "append")[index % 6]
        if kind == "flip":  # a few random bit flips anywhere
            for position in rng.integers(0, size, int(rng.integers(1, 9))):
                out[position] ^= 1 << int(rng.integers(0, 8))
        elif kind == "truncate":
            del out[int(rng.integers(1, size)) :]
        elif kind == "header":  # overwrite bytes where headers and size fields live
            for position in rng.integers(0, min(size, 64), int(rng.integers(1, 5))):
                out[position] = int(rng.integers(0, 256))
        elif kind == "inflate":  # a 16- or 32-bit field in the first 200 bytes set to a huge value
            position = int(rng.integers(0, min(size, 200) - 4))
            value = [0xFFFF, 0x7FFF, 0x8000, 0xFFFFFFFF, 0x7FFFFFFF, 65_000, 1 << 20][int(rng.integers(0, 7))]
            form = ["<I", ">I", "<H", ">H"][int(rng.integers(0, 4))]
            out[position : position + struct.calcsize(form)] = struct.pack(
                form, value & (0xFFFF if "H" in form else 0xFFFFFFFF)
            )
        elif kind == "repeat":  # a slice of the file repeated in place (duplicated chunks / markers)
            start = int(rng.integers(0, size))
            piece = bytes(out[start : start + int(rng.integers(1, 200))])
            out[start:start] = piece * int(rng.integers(1, 4))
        else:
            out += rng.integers(0, 256, int(rng.integers(1, 300)), dtype=np.uint8).tobytes()
        yield kind, bytes(out)


@pytest.fixture
def guarded_decoders(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Spy on OpenCV and Pillow: no decode may produce (or start on) more than LIMIT pixels."""
    real_imdecode, real_load = cv2.imdecode, Image.Image.load
    calls = [0]

    def imdecode(buffer: np.ndarray, flags: int) -> np.ndarray | None:
        calls[0] += 1
        image = real_imdecode(buffer, flags)
        assert image is None or image.shape[0] * image.shape[1] <= LIMIT, image.shape
        return image

    def load(self: Image.Image) -> object:
        assert self.size[0] * self.size[1] <= LIMIT, self.size
        return real_load(self)

    monkeypatch.setattr(cv2, "imdecode", imdecode)
    monkeypatch.setattr(Image.Image, "load", load)
    return calls


def test_mutated_files_of_every_format_raise_only_image_read_error(
    tmp_path: Path, guarded_decoders: list[int]
) -> None:
    rng = np.random.default_rng(SEED)
    outcomes = {"decoded": 0, "refused": 0}
    for seed_name, data in _seeds(tmp_path).items():
        assert decode_image(data, seed_name, max_pixels=LIMIT).shape == (30, 40)
        for number, (kind, mutant) in enumerate(_mutants(data, rng)):
            name = f"fuzz-{number}-{kind}-{seed_name}"
            channels = 1 + 2 * (number % 2)
            path = tmp_path / name
            path.write_bytes(mutant)
            try:
                read_image_size(path)  # the header-only reader (dataset loading, `check`) holds too
            except ImageReadError as error:
                assert name in str(error), error
            except Exception as error:  # noqa: BLE001 - the point of the test
                pytest.fail(f"{name}: {type(error).__name__} escaped read_image_size: {error}")
            try:
                image = decode_image(mutant, name, channels=channels, max_pixels=LIMIT)
            except ImageReadError as error:
                assert name in str(error), error
                outcomes["refused"] += 1
                continue
            except Exception as error:  # noqa: BLE001 - the point of the test
                pytest.fail(f"{name}: {type(error).__name__} escaped the decode path: {error}")
            assert image.dtype == np.uint8 and image.shape[0] * image.shape[1] <= LIMIT
            assert image.ndim == (2 if channels == 1 else 3)
            outcomes["decoded"] += 1
    assert outcomes["decoded"] > 20 and outcomes["refused"] > 100, outcomes  # both paths exercised
    assert guarded_decoders[0] > 100


def test_formats_outside_the_accepted_list_are_refused_mutated_or_not(
    tmp_path: Path, guarded_decoders: list[int]
) -> None:
    rng = np.random.default_rng(SEED + 2)
    for seed_name, data in _foreign_seeds(tmp_path).items():
        for number, (kind, mutant) in enumerate([("seed", data), *_mutants(data, rng)]):
            name = f"foreign-{number}-{kind}-{seed_name}"
            with pytest.raises(ImageReadError, match=rf"{name}.*(not an accepted image format|empty)"):
                decode_image(mutant, name, max_pixels=10**7)
    assert guarded_decoders[0] == 0  # refused from the magic bytes: no decoder ever ran


def test_mutated_pairs_raise_only_image_read_error_naming_the_bad_file(tmp_path: Path) -> None:
    rng = np.random.default_rng(SEED + 1)
    seeds = _seeds(tmp_path)
    good = seeds["gray.png"]
    for seed_name in ("color.jpg", "deep.tif", "gray.bmp"):
        for number, (kind, mutant) in enumerate(_mutants(seeds[seed_name], rng)):
            name = f"template-{number}-{kind}-{seed_name}"
            try:
                image, template = decode_pair(good, mutant, "image.png", name, max_pixels=LIMIT)
            except ImageReadError as error:
                assert name in str(error)
                continue
            assert image.dtype == template.dtype == np.uint8
