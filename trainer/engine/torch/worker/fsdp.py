"""A model sharded over a worker's ranks with FSDP2 (fully_shard).

models.py keeps each per-layer tensor stacked over the layers ([L, ...],
the Go model's layout). Here every layer becomes a module of its own
holding its slices (a Block), so that fully_shard can shard and gather one
transformer block at a time: each rank holds 1/world of every parameter
and of its gradient (the rows torch.chunk gives it), and a block's
parameters are whole on every rank only while that block computes. The
embeddings, the final norm and the head are sharded on the root module.

The model itself (models.Model) is built on the meta device and serves
only for its arithmetic (embed_tokens, block, head) and its shapes; the
parameters exist only here. The Go tensor i is addressed as a whole by
full (gathered), full_grad and load (scattered back into the shards).

A Hugging Face transformers model (hf.Transformers) keeps its own modules
(ShardedTransformers): fully_shard on each decoder layer, then on the whole
network for what is left (the embeddings, the final norm, the head). Its Go
tensor i is its i-th named parameter, one parameter sharded by rows as the
others are, so both classes share the addressing (RowShards).
"""

from typing import Callable, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import models


class Unshardable(ValueError):
    """A model fully_shard cannot split here (no decoder layers found, a
    parameter without rows): the message is one line for the user."""


def sum_gradients(modules: Iterable[nn.Module]) -> None:
    """A rank's loss is its tokens' sum over the whole batch's count
    (worker.rank_losses): the shards' gradients are the ranks' sum,
    reduced with a plain SUM (gloo has no pre-multiplied sum)."""
    for m in modules:
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)


class RowShards:
    """Go tensor i held by one parameter, or one per layer (stacked), each
    sharded by fully_shard's Shard(0): this rank holds the rows torch.chunk
    gives it. Subclasses say where a tensor lives (where, stacked, rows)
    and which parameters are sharded (sharded_params)."""

    world: int
    rank: int
    all_gather_into: Callable[[torch.Tensor, torch.Tensor], None]

    # Each subclass defines where a Go tensor lives, as methods rather than
    # abstract ones here: fully_shard swaps a module's class for one it
    # derives, which an ABCMeta class refuses ("object layout differs"):
    #   where(i) -> the parameters holding Go tensor i (one per layer, or one)
    #   stacked(i) -> whether Go tensor i is one parameter a layer
    #   rows(i) -> the rows of each of Go tensor i's parameters
    #   sharded_params() -> every parameter fully_shard shards, each once

    @torch.no_grad()
    def _gather(self, i: int, parts: List[torch.Tensor]) -> torch.Tensor:
        """Go tensor i whole from every rank's row chunks of its parts (one
        a layer, or one): one all_gather_into_tensor for the tensor, every
        layer's chunk padded to torch.chunk's chunk size."""
        stacked = self.stacked(i)
        rows = self.rows(i)
        cs = -(-rows // self.world)
        mine = torch.stack(parts)  # [parts, this rank's rows, ...]
        rest = tuple(mine.shape[2:])
        pad = torch.zeros((len(parts), cs) + rest, dtype=mine.dtype, device=mine.device)
        pad[:, :mine.shape[1]] = mine
        out = torch.empty((self.world * len(parts), cs) + rest, dtype=pad.dtype, device=pad.device)
        self.all_gather_into(out, pad)
        # [world, parts, cs, ...] -> [parts, world*cs, ...]: rank r's rows
        # start at r*cs, as torch.chunk cut them.
        whole = out.view((self.world, len(parts), cs) + rest).transpose(0, 1).reshape((len(parts), self.world * cs) + rest)[:, :rows]
        return whole.contiguous() if stacked else whole[0].contiguous()

    def full(self, i: int) -> torch.Tensor:
        """Go tensor i, gathered from every rank (a collective)."""
        return self._gather(i, [p.to_local() for p in self.where(i)])

    def full_grad(self, i: int) -> torch.Tensor:
        """Go tensor i's gradient, gathered (a collective)."""
        return self._gather(i, [p.grad.to_local() if p.grad is not None else torch.zeros_like(p.to_local())
                                for p in self.where(i)])

    @torch.no_grad()
    def load(self, i: int, full: torch.Tensor) -> None:
        """Sets this rank's shards of Go tensor i from the whole of it (the
        same on every rank): the rows torch.chunk gives this rank, as
        fully_shard's Shard(0) places them."""
        slabs = full.unbind(0) if self.stacked(i) else [full]
        for p, slab in zip(self.where(i), slabs):
            local = p.to_local()
            chunks = torch.chunk(slab, self.world, dim=0)
            mine = chunks[self.rank] if self.rank < len(chunks) else slab[:0]
            if local.shape != mine.shape:
                raise RuntimeError("fsdp: tensor %d's shard is %s here, %s by torch.chunk"
                                   % (i, tuple(local.shape), tuple(mine.shape)))
            local.copy_(mine)

    def locals(self) -> List[torch.Tensor]:
        """This rank's shards of every parameter (views: writing them writes
        the model)."""
        return [p.to_local() for p in self.sharded_params()]

    def local_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.locals())

    def drop_grads(self) -> None:
        for p in self.sharded_params():
            p.grad = None


class Block(nn.Module):
    """One layer's slice of each stacked tensor (layer_index order)."""

    def __init__(self, model: models.Model, shapes: Sequence[Tuple[int, ...]]):
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.empty(s, device="meta")) for s in shapes])
        self.cast = list(model.layer_cast)
        # A bound method, not a submodule: the meta model's parameters stay
        # out of this module's.
        self.fn = model.block

    def forward(self, x: torch.Tensor, extra: object, amp: Optional[torch.dtype]) -> torch.Tensor:
        # Under autocast the products' weights go to amp layer by layer, as
        # layer_views casts the stacks: the same values.
        ps = [p.to(amp) if cast and amp is not None else p for p, cast in zip(self.ps, self.cast)]
        return self.fn(x, ps, extra)


class Sharded(RowShards, nn.Module):
    def __init__(self, model: models.Model, device: torch.device, world: int, rank: int,
                 all_gather_into: Callable[[torch.Tensor, torch.Tensor], None]):
        """all_gather_into(out, t): every rank's t into out, rank order (the
        worker's, which counts its collectives)."""
        super().__init__()
        self.all_gather_into = all_gather_into
        object.__setattr__(self, "m", model)  # not a submodule: see Block.fn
        self.world, self.rank, self.device_type = world, rank, device.type
        self.rest = nn.ParameterList([nn.Parameter(torch.empty(model.tensors[i].shape, device="meta"))
                                      for i in model.rest_index])
        shapes = [tuple(model.tensors[i].shape[1:]) for i in model.layer_index]
        self.blocks = nn.ModuleList([Block(model, shapes) for _ in range(model.layers)])
        mesh = init_device_mesh(device.type, (world,))
        for b in self.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(self, mesh=mesh)
        # Only this rank's shards take memory; load fills them.
        self.to_empty(device=device)
        model.real_buffers(device)
        sum_gradients([self, *self.blocks])
        # Parameters are looked up when needed, never kept: FSDP swaps a
        # module's parameter objects as it gathers and reshards them.
        self.slot = {i: (True, j) for j, i in enumerate(model.layer_index)}
        self.slot.update({i: (False, k) for k, i in enumerate(model.rest_index)})
        self.layered = set(model.layer_index)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor, amp: Optional[torch.dtype]) -> torch.Tensor:
        """Each token's loss, [b*t] float32, as models.Model.token_losses."""
        if amp is None:
            logits = self._logits(inputs, None)
        else:
            with torch.autocast(device_type=self.device_type, dtype=amp):
                logits = self._logits(inputs, amp)
        return models.cross_entropy(logits, targets.reshape(-1).long())

    def _logits(self, inputs: torch.Tensor, amp: Optional[torch.dtype]) -> torch.Tensor:
        rest = list(self.rest)
        x, extra = self.m.embed_tokens(inputs, rest)
        for b in self.blocks:
            x = b(x, extra, amp)
        return self.m.head(x, rest)

    def where(self, i: int) -> List[nn.Parameter]:
        """The parameters holding Go tensor i: one per layer, or one."""
        stacked, j = self.slot[i]
        return [b.ps[j] for b in self.blocks] if stacked else [self.rest[j]]

    def stacked(self, i: int) -> bool:
        return i in self.layered

    def rows(self, i: int) -> int:
        return self.m.tensors[i].shape[1 if i in self.layered else 0]

    def sharded_params(self) -> Iterable[nn.Parameter]:
        return self.parameters()


def decoder_layers(net: nn.Module) -> nn.ModuleList:
    """The network's transformer blocks: the ModuleList whose items are the
    classes the model names as never to be split across devices
    (_no_split_modules: its decoder layer, what transformers' own FSDP
    wrapping takes), else the largest list of modules of one class that hold
    parameters (model.layers in the Llama, Qwen, Gemma and Mistral
    families, transformer.h in GPT-2)."""
    lists = [m for m in net.modules() if isinstance(m, nn.ModuleList) and len(m) > 0
             and all(next(x.parameters(), None) is not None for x in m)]
    blocks = set(getattr(net, "_no_split_modules", None) or [])
    named = [l for l in lists if all(type(x).__name__ in blocks for x in l)]
    alike = named or [l for l in lists if len({type(x) for x in l}) == 1]
    if not alike:
        raise Unshardable("%s has no list of decoder layers to shard one at a time (no nn.ModuleList of its "
                          "transformer blocks): use --placement replicate" % type(net).__name__)
    return max(alike, key=lambda l: sum(p.numel() for p in l.parameters()))


class ShardedTransformers(RowShards):
    def __init__(self, model: models.Model, device: torch.device, world: int, rank: int,
                 all_gather_into: Callable[[torch.Tensor, torch.Tensor], None]):
        """model: an hf.Transformers whose network holds its weights (on
        the CPU, say: fully_shard moves each parameter's rows to device and
        lets the rest go). all_gather_into as Sharded's."""
        self.all_gather_into = all_gather_into
        self.world, self.rank, self.device_type = world, rank, device.type
        self.m = model
        net = model.net
        shapes = [tuple(p.shape) for p in model.tensors]
        for name, s in zip(model.names, shapes):
            if not s:
                raise Unshardable("parameter %s is a scalar: fully_shard splits parameters by rows; "
                                  "use --placement replicate" % name)
        layers = decoder_layers(net)
        # The model's list held the whole parameters: kept, it would keep
        # the whole model alive beside the shards. Placeholders keep the
        # shapes the worker reads.
        model.tensors = [torch.empty(s, device="meta") for s in shapes]
        mesh = init_device_mesh(device.type, (world,))
        for layer in layers:
            fully_shard(layer, mesh=mesh)
        # The root takes the rest, a tied head with its embedding: one
        # parameter, one shard.
        fully_shard(net, mesh=mesh)
        sum_gradients([*layers, net])
        # Each named parameter by its owner and attribute, looked up when
        # needed (as Sharded's: FSDP swaps the objects it gathers).
        self.owner = []
        for name in model.names:
            path, _, attr = name.rpartition(".")
            self.owner.append((net.get_submodule(path), attr))
        self.shapes = shapes

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor, amp: Optional[torch.dtype]) -> torch.Tensor:
        """Each token's loss, [b*t] float32, as models.Model.token_losses."""
        b, t = inputs.shape
        if b == 0:
            # A rank without sequences still takes part in every layer's
            # gathers (and, backward, in its reductions), but transformers
            # cannot shape an empty batch's heads: one sequence of token 0
            # goes through, none of its losses kept (its gradient zero).
            inputs, targets = inputs.new_zeros((1, t)), targets.new_zeros((1, t))
        if amp is None:
            logits = self.m.logits(inputs, None)
        else:
            with torch.autocast(device_type=self.device_type, dtype=amp):
                logits = self.m.logits(inputs, amp)
        return models.cross_entropy(logits, targets.reshape(-1).long())[:b * t]

    def where(self, i: int) -> List[nn.Parameter]:
        module, attr = self.owner[i]
        return [getattr(module, attr)]

    def stacked(self, i: int) -> bool:
        return False

    def rows(self, i: int) -> int:
        return self.shapes[i][0]

    def sharded_params(self) -> Iterable[nn.Parameter]:
        return self.m.net.parameters()
