"""Tiny stand-ins honouring the Detector / DetectionDataset contracts, for fast engine tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch
from torch import nn

from defectdet.data.letterbox import compute_letterbox
from defectdet.data.sample import Sample


class Poison(nn.Module):
    """Identity, or multiplies by NaN when `active` (to test non-finite diagnosis)."""

    def __init__(self) -> None:
        super().__init__()
        self.active = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * float("nan") if self.active else x


class TinyDetector(nn.Module):
    """Predicts one box per stride-8 cell; the loss pulls scores toward 'a target exists' and boxes to it."""

    def __init__(self, in_channels: int = 1, num_classes: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        self.config = {
            "preset": "fake",
            "num_classes": num_classes,
            "in_channels": in_channels,
            "template": False,
        }
        self.num_classes = num_classes
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU()
        )
        self.poison = Poison()
        self.body = nn.Sequential(nn.Conv2d(8, 8, 3, stride=4, padding=1), nn.ReLU(), nn.Dropout(dropout))
        self.head = nn.Conv2d(8, 4 + num_classes, 1)

    def _raw(self, images: torch.Tensor) -> torch.Tensor:
        features = self.body(self.poison(self.stem(images)))  # (B, 8, S/8, S/8)
        return self.head(features).flatten(2).transpose(1, 2)  # (B, A, 4 + K)

    def forward(self, images: torch.Tensor, targets: list[torch.Tensor] | None = None):
        raw = self._raw(images)
        size = images.shape[-1]
        boxes = raw[..., :4].sigmoid() * size  # (B, A, 4)
        boxes = torch.cat(
            [torch.minimum(boxes[..., :2], boxes[..., 2:]), torch.maximum(boxes[..., :2], boxes[..., 2:])], -1
        )
        scores = raw[..., 4:].float().sigmoid()  # (B, A, K)
        if targets is None:
            return torch.cat([boxes.float(), scores], -1)
        wanted = torch.zeros_like(scores)
        box_loss = raw.new_zeros((), dtype=torch.float32)
        for index, target in enumerate(targets):
            if len(target):
                wanted[index, :, target[0, 0].long()] = 1.0
                box_loss = box_loss + ((boxes[index] - target[0, 1:]) / size).float().pow(2).mean()
        class_loss = nn.functional.binary_cross_entropy_with_logits(raw[..., 4:].float(), wanted)
        box_loss = box_loss / max(1, len(targets))
        return {
            "loss": class_loss + box_loss,
            "loss_class": class_loss.detach(),
            "loss_box": box_loss.detach(),
        }


class TinyDataset(torch.utils.data.Dataset):
    """`length` gray size x size images with one bright square (class = i % 2); adds global-RNG noise."""

    def __init__(self, length: int = 16, size: int = 32, noise: float = 0.05, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.items = []
        for index in range(length):
            image = torch.rand(1, size, size, generator=generator) * 0.2
            x, y = torch.randint(0, size // 2, (2,), generator=generator).tolist()
            side = size // 3
            image[:, y : y + side, x : x + side] += 0.7
            target = torch.tensor([[index % 2, x, y, x + side, y + side]], dtype=torch.float32)
            self.items.append((image, target))
        self.size = size
        self.noise = noise

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        image, target = self.items[index]
        image = image + self.noise * torch.randn_like(image)  # global torch RNG: exercises RNG restore
        meta = {
            "image_id": f"img{index}",
            "image_path": None,
            "transform": compute_letterbox(self.size, self.size, self.size),
        }
        return image, target.clone(), meta

    def written(self, folder: Path) -> TinyFileSet:
        """The images (without the per-read noise) as PNG files with their boxes as label-file ground truth:
        what `engine.loop.evaluate` reads, like a `DetectionDataset` for evaluation."""
        folder.mkdir(parents=True, exist_ok=True)
        samples = []
        for index, (image, target) in enumerate(self.items):
            path = folder / f"img{index}.png"
            pixels = np.clip(np.rint(image[0].numpy() * 255), 0, 255).astype(np.uint8)
            assert cv2.imwrite(str(path), pixels)
            samples.append(
                Sample(path, target[:, 1:].numpy(), target[:, 0].long().numpy(), image_id=f"img{index}")
            )
        return TinyFileSet(samples, self.size)


@dataclass
class TinyFileSet:
    """The attributes `engine.loop.evaluate` reads from a `DetectionDataset`."""

    samples: list[Sample]
    input_size: int
    channels: int = 1
    use_template: bool = False
    register_pairs: bool = False

    def __len__(self) -> int:
        return len(self.samples)
