"""Exponential moving average of model weights, with a decay that ramps up from 0.

Early in training the weights move fast, so a fixed 0.9998 decay would average in the random
initialisation for thousands of steps; decay(n) = decay * (1 - exp(-n / ramp_steps)) avoids that.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn


class ModelEMA:
    """Keeps `self.module`, an eval-mode copy of the model whose float tensors track the EMA."""

    def __init__(self, model: nn.Module, decay: float = 0.9998, ramp_steps: float = 1000.0, updates: int = 0):
        self.module = copy.deepcopy(model).eval()
        for parameter in self.module.parameters():
            parameter.requires_grad_(False)
        self.decay = decay
        self.ramp_steps = ramp_steps
        self.updates = updates

    def current_decay(self) -> float:
        return self.decay * (1.0 - math.exp(-self.updates / self.ramp_steps))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """ema = d * ema + (1 - d) * model for float tensors; integer buffers are copied."""
        self.updates += 1
        decay = self.current_decay()
        model_state = model.state_dict()
        for name, ema_value in self.module.state_dict().items():
            value = model_state[name].detach()
            if ema_value.dtype.is_floating_point:
                ema_value.mul_(decay).add_(value.to(ema_value.dtype), alpha=1.0 - decay)
            else:
                ema_value.copy_(value)

    def state_dict(self) -> dict:
        return {
            "module": self.module.state_dict(),
            "updates": self.updates,
            "decay": self.decay,
            "ramp_steps": self.ramp_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        from defectdet.engine.state_dict import load_state_dict_checked

        load_state_dict_checked(self.module, state["module"], source="checkpoint 'ema'")
        self.updates = int(state["updates"])
