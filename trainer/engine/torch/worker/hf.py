"""Hugging Face transformers causal LMs for psyche's PyTorch worker.

A run of architecture Transformers names a config.json; every trainer builds
the network from it with AutoModelForCausalLM.from_config (never fetching
anything: HF_HUB_OFFLINE is set before transformers is imported) and trains
its named parameters under the worker's DisTrO. The weights are either drawn
from the run's seed, on the CPU under a private RNG state, so that every
trainer draws the same ones whatever its device, or copied in by psyche.
"""

import contextlib
import json
import os
import sys
from typing import Dict, List, Optional, Tuple

import torch

import models

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


class Unbuildable(ValueError):
    """The config cannot become a model here (transformers missing, an
    unknown model_type, not a causal LM): the message is one line for the
    user."""


def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise Unbuildable("transformers is not installed in %s (%s): install it there (pip install transformers) "
                          "or point --python at an environment that has it" % (sys.executable, exc)) from None
    transformers.logging.set_verbosity_error()
    return transformers


def config_of(text: str):
    """The transformers config of a config.json's text."""
    tf = _transformers()
    raw = json.loads(text)
    model_type = raw.get("model_type", "")
    try:
        return tf.AutoConfig.for_model(model_type, **{k: v for k, v in raw.items() if k != "model_type"})
    except (ValueError, KeyError) as exc:
        raise Unbuildable("model_type %r is unknown to transformers %s in %s (%s): fix the config's model_type, "
                          "or install a transformers that knows it there (pip install -U transformers)"
                          % (model_type, tf.__version__, sys.executable, str(exc).splitlines()[0])) from None


def _network(config, sdpa: bool) -> torch.nn.Module:
    tf = _transformers()
    config.use_cache = False
    try:
        net = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa" if sdpa else "eager",
                                                  dtype=torch.float32)
    except ValueError as exc:
        raise Unbuildable("transformers cannot build a causal LM of model_type %r: %s"
                          % (config.model_type, str(exc).splitlines()[0])) from None
    # Dropout off: every trainer must compute the same losses for the same
    # weights (witnesses and verifiers recompute them).
    return net.float().eval()


@contextlib.contextmanager
def _seeded(seed: int):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class Transformers(models.Model):
    """A transformers causal LM whose parameters are its named parameters
    (a tied head appears once, as the embedding)."""

    arch = "transformers"

    def __init__(self, net: torch.nn.Module):
        # Module's constructor, not Model's: Model's builds psyche's own
        # tensors, which transformers' network replaces here.
        torch.nn.Module.__init__(self)
        self.net = net
        named = list(net.named_parameters())
        self.names = [n for n, _ in named]
        self.tensors = [p for _, p in named]

    def logits(self, inputs: torch.Tensor, amp_dtype: Optional[torch.dtype]) -> torch.Tensor:
        b, t = inputs.shape
        out = self.net(input_ids=inputs.long(), use_cache=False).logits
        return out.reshape(b * t, out.shape[-1])


def build(cfg: Dict, device: torch.device, seed: Optional[int]) -> Transformers:
    """The model of cfg["json"] (a config.json's text) on device, its
    weights drawn from seed, or (seed None) left as built for psyche to
    overwrite."""
    config = config_of(cfg["json"])
    # Fused attention where psyche's own models use it (every torch 2.6+
    # has it; tests may turn it off for psyche's models and so here).
    sdpa = getattr(models, "HAS_SDPA", True) and getattr(models, "USE_SDPA", True)
    if seed is None:
        net = _network(config, sdpa)
    else:
        with _seeded(seed):
            net = _network(config, sdpa)
    return Transformers(net.to(device))


def describe(cfg: Dict) -> Tuple[List[str], List[List[int]]]:
    """The names and shapes of cfg's parameters, without allocating them."""
    config = config_of(cfg["json"])
    with torch.device("meta"):
        net = _network(config, False)
    named = list(net.named_parameters())
    return [n for n, _ in named], [list(p.shape) for _, p in named]
