"""The architectures the worker builds, by the name psyche's open request
gives them: psyche's own GPT and Llama (models.py, the Go model's tensors and
arithmetic) and any Hugging Face transformers causal LM (hf.py)."""

from typing import Dict, List, Optional, Tuple

import torch

import hf
import models
from protocol import Kind, Refused


def is_transformers(arch: str) -> bool:
    return arch == hf.Transformers.arch


def build(arch: str, cfg: Dict, device: torch.device, seed: Optional[int]) -> models.Model:
    """The model of arch and cfg on device: a transformers model's weights
    drawn from seed (None: left for psyche to copy in), psyche's own models'
    zero until loaded."""
    try:
        if is_transformers(arch):
            return hf.build(cfg, device, seed)
        return models.build(arch, cfg, device)
    except (hf.Unbuildable, models.UnknownArchitecture) as exc:
        raise Refused(Kind.INPUT, str(exc)) from None


def describe(cfg: Dict) -> Tuple[List[str], List[List[int]]]:
    """A transformers config's parameter names and shapes, nothing allocated."""
    try:
        return hf.describe(cfg)
    except hf.Unbuildable as exc:
        raise Refused(Kind.INPUT, str(exc)) from None
