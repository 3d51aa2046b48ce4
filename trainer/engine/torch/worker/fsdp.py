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
"""

from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import models


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


class Sharded(nn.Module):
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
        # A rank's loss is its tokens' sum over the whole batch's count
        # (worker.rank_losses): the shards' gradients are the ranks' sum,
        # reduced with a plain SUM (gloo has no pre-multiplied sum).
        for m in [self, *self.blocks]:
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
        # Parameters are looked up when needed, never kept: FSDP swaps a
        # module's parameter objects as it gathers and reshards them.
        self.slot = {i: (True, j) for j, i in enumerate(model.layer_index)}
        self.slot.update({i: (False, k) for k, i in enumerate(model.rest_index)})
        self.stacked = set(model.layer_index)

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

    @torch.no_grad()
    def _gather(self, i: int, parts: List[torch.Tensor]) -> torch.Tensor:
        """Go tensor i whole from every rank's row chunks of its parts (one
        a layer, or one): one all_gather_into_tensor for the tensor, every
        layer's chunk padded to torch.chunk's chunk size."""
        stacked = i in self.stacked
        rows = self.m.tensors[i].shape[1 if stacked else 0]
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
        slabs = full.unbind(0) if i in self.stacked else [full]
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
        return [p.to_local() for p in self.parameters()]

    def local_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.locals())

    def drop_grads(self) -> None:
        for p in self.parameters():
            p.grad = None
