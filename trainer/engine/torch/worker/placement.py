"""Where a worker's model lives and how its ranks share the work.

Single holds the model on one device. A multi-device worker has a process
per device (ranks.py); its ranks either each hold the whole model and split
every batch (Replicated: data parallel, the gradient all-reduced in
buckets, rank 0 alone steps DisTrO) or each hold a shard of every
parameter (Sharded: FSDP2, fsdp.py; DisTrO's state and step split by rows
of tiles). The op handlers (ops.py) call a placement and never ask which it
is: each placement answers every call in its own way.

A placement owns the model as placed, its DisTrO optimizer (distro.DeMo)
and the functions that compute losses; the handlers own the protocol's
state (a gradient kept, a try to undo).
"""

import json
import math
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

import distro
import models
import registry
from protocol import Kind, Op, Refused, say
from tensors import allocated, f32_bytes, from_f32, from_u32, is_oom, u32_bytes

# The most elements one bucketed collective carries (64 MiB of float32).
BUCKET = 1 << 24

# A round's aggregate as the worker reads it: per tensor, the tiles, the
# indices within them and the values.
Combined = List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def split_rows(n: int, world: int, r: int) -> Tuple[int, int]:
    """Rank r's contiguous share [a, b) of n rows (shares differ by one at
    most; a rank's share is empty when n < world)."""
    return n * r // world, n * (r + 1) // world


class Single:
    """The model, its gradient and DisTrO's state on one device."""

    name = "single device"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.g = None  # ranks.Group of a multi-device worker
        self.model: Optional[models.Model] = None
        self.demo: Optional[distro.DeMo] = None
        self.amp: Optional[torch.dtype] = None
        self.loss_fn: Optional[Callable] = None
        self.tok_fn: Optional[Callable] = None
        self.shapes: List[List[int]] = []

    @property
    def rank(self) -> int:
        return 0

    def forwards(self, op: str) -> bool:
        """Whether the other ranks take part in op."""
        return False

    # -- the model -------------------------------------------------------

    def build(self, h: Dict) -> models.Model:
        return registry.build(h["arch"], h["config"], self.device, h.get("seed"))

    def place(self, model: models.Model) -> List[torch.Tensor]:
        """Takes the built model; returns the tensors load fills in order."""
        self.model = model
        self.loss_fn, self.tok_fn = model.forward_losses, model.token_losses
        return list(model.tensors)

    def load(self, tensors: Sequence[torch.Tensor], blobs: Optional[List[bytes]], drawn: bool) -> None:
        """Copies psyche's weights in: blobs on rank 0, None on the other
        ranks and when the model drew its own (drawn)."""
        if blobs is None:
            return
        with torch.no_grad():
            for i, p in enumerate(tensors):
                p.copy_(from_f32(blobs[i], p.shape))
                # Each blob let go once copied (the request's list is the
                # only other holder): the weights are not held twice while
                # the rest load and DisTrO's state is made.
                blobs[i] = b""

    def optimizer(self, layouts: List[Dict], opts: Dict) -> distro.DeMo:
        return distro.DeMo(layouts, opts, self.device)

    def num_params(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    def held_bytes(self) -> int:
        return sum(p.numel() * 4 for p in self.model.tensors) + self.demo.state_bytes()

    def compile(self) -> bool:
        """Compiles the loss functions; False where the placement runs eagerly."""
        # torch.compile compiles at a shape's first call (a minute or more
        # on a CPU); the kernels persist in TORCHINDUCTOR_CACHE_DIR (psyche
        # points it at its cache directory: inductorCacheEnv), so that a
        # later worker on the same shapes starts in seconds.
        self.loss_fn = torch.compile(self.model.forward_losses)
        self.tok_fn = torch.compile(self.model.token_losses)
        return True

    def describe(self) -> str:
        return str(self.device)

    def log_memory(self) -> None:
        """Says what each device holds (one device: psyche's log has it)."""

    # -- what travels with a request ---------------------------------------

    def batch(self, h: Dict, blobs: Optional[List[bytes]]) -> Tuple[torch.Tensor, torch.Tensor]:
        b, t = int(h["b"]), int(h["t"])
        lens = h.get("blobs", [])
        if len(lens) != 2 or lens[0] != 4 * b * t or lens[1] != 4 * b * t or b <= 0 or t <= 0:
            raise Refused(Kind.INPUT, "a %d×%d batch needs two blobs of %d bytes" % (b, t, 4 * b * t))
        if blobs is None:  # another rank: rank 0 sends the tokens
            x = torch.empty(b, t, dtype=torch.int64, device=self.device)
            y = torch.empty(b, t, dtype=torch.int64, device=self.device)
        else:
            x = from_u32(blobs[0]).view(b, t).to(self.device)
            y = from_u32(blobs[1]).view(b, t).to(self.device)
        self.share_from_rank0(x, y)
        return x, y

    def combined(self, h: Dict, blobs: Optional[List[bytes]]) -> Combined:
        n = len(self.shapes)
        lens = h.get("blobs", [])
        if len(lens) != 3 * n:
            raise Refused(Kind.INPUT, "an aggregate of %d blobs for %d tensors" % (len(lens), n))
        counts = [int(lens[3 * i]) // 4 for i in range(n)]
        if blobs is not None:
            ints = [from_u32(blobs[3 * i + j]) for i in range(n) for j in (0, 1)]
            vals = [from_f32(blobs[3 * i + 2], (-1,)) for i in range(n)]
            ints = torch.cat(ints).to(self.device) if ints else torch.zeros(0, dtype=torch.int64)
            vals = torch.cat(vals).to(self.device) if vals else torch.zeros(0)
        else:
            ints = torch.empty(2 * sum(counts), dtype=torch.int64, device=self.device)
            vals = torch.empty(sum(counts), dtype=torch.float32, device=self.device)
        self.share_from_rank0(ints, vals)
        out, o, v = [], 0, 0
        for c in counts:
            out.append((ints[o:o + c], ints[o + c:o + 2 * c], vals[v:v + c]))
            o, v = o + 2 * c, v + c
        return out

    def share_from_rank0(self, *ts: torch.Tensor) -> None:
        """Gives every rank rank 0's values of ts (one device: nothing)."""

    def all_ranks(self, mine: torch.Tensor) -> List[torch.Tensor]:
        """Every rank's mine (a tensor of one shape on every rank), in rank order."""
        return [mine]

    # -- compute -----------------------------------------------------------

    def losses(self, x: torch.Tensor, y: torch.Tensor) -> Tuple[float, torch.Tensor]:
        with torch.no_grad():
            loss, seq = self.loss_fn(x, y, self.amp)
        return float(loss.detach().float().item()), seq

    def gradient(self, x: torch.Tensor, y: torch.Tensor) -> Tuple[float, torch.Tensor]:
        loss, seq = self.loss_fn(x, y, self.amp)
        loss.backward()
        return float(loss.detach().float().item()), seq

    def drop_grads(self) -> None:
        for p in self.model.tensors:
            p.grad = None

    def kept_grads(self) -> List[torch.Tensor]:
        return [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.model.tensors]

    def step(self, lr: float) -> List[bytes]:
        """DisTrO's step on the kept gradient: a frame's entries, an index
        blob and a value blob a tensor."""
        try:
            out = self.demo.step(self.kept_grads(), lr)
        except distro.NonFinite as exc:
            raise Refused(Kind.NONFINITE, str(exc) or "the gradient is not finite")
        blobs = []
        for idx, vals in out:
            blobs += [u32_bytes(idx), f32_bytes(vals)]
        return blobs

    def apply(self, comb: Combined, lr: float) -> None:
        # Detached views: DeMo writes the weights in place.
        self.demo.apply([p.detach() for p in self.model.tensors], comb, lr)

    def locals(self) -> List[torch.Tensor]:
        """What this rank holds of the parameters (a try saves and an undo
        restores exactly these)."""
        return [p.detach() for p in self.model.tensors]

    def whole_tensors(self) -> Iterator[torch.Tensor]:
        """The model's tensors, whole, in order."""
        yield from self.model.tensors

    def whole_tensor(self, i: int) -> torch.Tensor:
        """The model's tensor i, whole."""
        return self.model.tensors[i]

    def grads(self) -> List[bytes]:
        return [f32_bytes(g) for g in self.kept_grads()]

    def set_grads(self, blobs: Optional[List[bytes]]) -> None:
        for p, b in zip(self.model.tensors, blobs):
            p.grad = from_f32(b, p.shape).to(self.device)

    def memory(self) -> int:
        return allocated(self.device)


class Ranks(Single):
    """What both multi-device placements share: rank 0 hands every request's
    data to the others by collectives, and each rank computes its contiguous
    share of a batch."""

    def __init__(self, device: torch.device, g) -> None:
        super().__init__(device)
        self.g = g

    @property
    def rank(self) -> int:
        return self.g.rank

    def forwards(self, op: str) -> bool:
        # Rank 0 alone answers hello, describe and stats.
        return op not in (Op.HELLO, Op.DESCRIBE, Op.STATS)

    def describe(self) -> str:
        return ",".join(str(d) for d in self.g.devices)

    def share_from_rank0(self, *ts: torch.Tensor) -> None:
        for t in ts:
            self.g.broadcast(t, 0)

    def all_ranks(self, mine: torch.Tensor) -> List[torch.Tensor]:
        out = [torch.zeros_like(mine) for _ in range(self.g.world)]
        self.g.all_gather(out, mine)
        return out

    def log_memory(self) -> None:
        mem = self.memory() or self.held_bytes()
        out = self.all_ranks(torch.tensor([float(mem)], dtype=torch.float64))
        if self.rank == 0:
            kind = "allocated" if self.device.type == "cuda" else "parameters and DisTrO state"
            say("memory per device (%s): %s" % (kind, ", ".join(
                "%s %.3f GiB" % (d, float(m[0]) / 2**30) for d, m in zip(self.g.devices, out))))

    def losses(self, x: torch.Tensor, y: torch.Tensor) -> Tuple[float, torch.Tensor]:
        return self.rank_losses(x, y, False)

    def rank_losses(self, x: torch.Tensor, y: torch.Tensor, backward: bool) -> Tuple[float, torch.Tensor]:
        """This rank's share of the batch (contiguous sequences) forward and,
        with backward, backward: the batch's mean loss and every sequence's,
        gathered in order. The rank's loss is its tokens' sum over the
        batch's token count, so that the ranks' gradients sum to the mean's
        (each token's weight 1/n, rounded as the one-device mean rounds it).
        A rank out of memory makes every rank refuse the batch alike."""
        b, t = x.shape
        world = self.g.world
        a, e = split_rows(b, world, self.rank)
        status = torch.zeros(1, dtype=torch.int64)
        local = torch.zeros((), dtype=torch.float64, device=self.device)
        seq = torch.zeros(0, dtype=torch.float32, device=self.device)
        msg = ""
        try:
            if e > a or self.computes_empty_shares():
                self.entering_collectives()
                with torch.set_grad_enabled(backward):
                    tok = self.tok_fn(x[a:e], y[a:e], self.amp).double()
                    local = tok.sum()
                    if backward:
                        (local / (b * t)).to(torch.float32).backward()
                seq = tok.detach().view(e - a, t).mean(dim=1).float()
                local = local.detach()
            if backward:
                self.fill_missing_grads()
        except Exception as exc:
            if not is_oom(exc):
                raise
            status[0], msg = 1, str(exc).strip()
            self.drop_grads()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        codes = self.all_ranks(status)
        bad = [r for r, c in enumerate(codes) if int(c[0])]
        if bad:
            self.drop_grads()
            raise Refused(Kind.OOM, msg if self.rank in bad else
                          "%s ran out of memory" % ", ".join(self.g.name(r) for r in bad))
        total = local.detach().to("cpu", torch.float64).reshape(1)
        self.g.all_reduce(total)
        sizes = [split_rows(b, world, r)[1] - split_rows(b, world, r)[0] for r in range(world)]
        mine = torch.zeros(max(sizes), dtype=torch.float32)
        mine[:e - a] = seq.to("cpu")
        out = self.all_ranks(mine)
        seqs = torch.cat([o[:n] for o, n in zip(out, sizes)])
        return float(np.float32(float(total[0]) / (b * t))), seqs

    def computes_empty_shares(self) -> bool:
        """Whether a rank without sequences still runs its (empty) share."""
        return False

    def entering_collectives(self) -> None:
        """Called before a pass that enters collectives with every rank."""

    def fill_missing_grads(self) -> None:
        """Every rank holds a gradient for every tensor after a backward (a
        rank without sequences: zeros), so that the all-reduce sums alike."""
        for p in self.model.tensors:
            if p.grad is None:
                p.grad = torch.zeros_like(p)


class Replicated(Ranks):
    """Each rank holds the whole model and computes its share of every batch;
    the gradient is all-reduced in buckets, and rank 0 alone holds DisTrO's
    state and steps (every rank applies every round)."""

    name = "data parallel"

    def forwards(self, op: str) -> bool:
        # Rank 0 alone steps, holds the gradient psyche reads or sets, and
        # hands out the parameters, whole or a range (every rank holds them
        # whole).
        return super().forwards(op) and op not in (Op.STEP, Op.GRADS, Op.SET_GRADS, Op.PARAMS, Op.READ)

    def load(self, tensors: Sequence[torch.Tensor], blobs: Optional[List[bytes]], drawn: bool) -> None:
        super().load(tensors, blobs, drawn)
        # Rank 0's weights, psyche's or drawn, to every rank.
        with torch.no_grad():
            for p in tensors:
                self.g.broadcast(p, 0)

    def optimizer(self, layouts: List[Dict], opts: Dict) -> distro.DeMo:
        return distro.DeMo(layouts, opts, self.device, state=self.rank == 0)

    def gradient(self, x: torch.Tensor, y: torch.Tensor) -> Tuple[float, torch.Tensor]:
        loss, seq = self.rank_losses(x, y, True)
        self.all_reduce_bucketed([p.grad for p in self.model.tensors])
        return loss, seq

    def all_reduce_bucketed(self, ts: Sequence[torch.Tensor]) -> None:
        """Sums each tensor in ts over the ranks in place, in flat buckets
        of up to BUCKET elements (one collective each, not one a tensor)."""
        bucket: List[torch.Tensor] = []
        for t in list(ts) + [None]:
            if t is not None and (not bucket or sum(b.numel() for b in bucket) + t.numel() <= BUCKET):
                bucket.append(t)
                continue
            if bucket:
                flat = torch.cat([b.reshape(-1) for b in bucket])
                self.g.all_reduce(flat)
                for b, part in zip(bucket, flat.split([b.numel() for b in bucket])):
                    b.copy_(part.view(b.shape))
            bucket = [t] if t is not None else []


class Sharded(Ranks):
    """Each rank holds torch.chunk's rows of every parameter (FSDP2's
    fully_shard per transformer block, fsdp.py) and of its reduce-scattered
    gradient. DisTrO's state and step are split otherwise: each rank owns a
    contiguous range of every tensor's rows of tiles (shares), so that the
    tiles a rank compresses are whole; the step and an apply gather one
    tensor whole at a time."""

    name = "sharded (FSDP2)"

    def __init__(self, device: torch.device, g) -> None:
        super().__init__(device, g)
        self.sharded = None  # the fsdp module holding the parameters' shards
        self.cuts: List[List[int]] = []  # per tensor, the element offset of each rank's share (world+1 of them)
        self.tile_cuts: List[List[int]] = []  # per tensor, the first tile of each rank's share
        self.own_grads: List[torch.Tensor] = []  # this rank's share of each gradient, reduced

    def build(self, h: Dict) -> models.Model:
        # psyche's own models are built on the meta device (their shapes
        # and arithmetic; fsdp.Sharded holds the parameters). A
        # transformers model is built whole on the CPU by every rank
        # (drawing the one-device worker's weights, on the CPU too), and
        # fully_shard keeps its rows of each on the device.
        where = torch.device("cpu") if registry.is_transformers(h["arch"]) else torch.device("meta")
        return registry.build(h["arch"], h["config"], where, h.get("seed"))

    def place(self, model: models.Model) -> List[torch.Tensor]:
        import fsdp  # noqa: E402  (only a sharded worker needs FSDP)
        kind = fsdp.ShardedTransformers if registry.is_transformers(model.arch) else fsdp.Sharded
        try:
            self.sharded = kind(model, self.device, self.g.world, self.rank, self.g.all_gather_into)
        except fsdp.Unshardable as exc:
            raise Refused(Kind.INPUT, str(exc)) from None
        super().place(model)
        self.tok_fn = self.sharded
        self.own_grads = []
        # Placeholders now (the shapes): the whole tensors are gone.
        return list(model.tensors)

    def load(self, tensors: Sequence[torch.Tensor], blobs: Optional[List[bytes]], drawn: bool) -> None:
        if drawn:
            # Each rank's shards were cut from its own draw, the same on
            # every rank: nothing to load.
            return
        with torch.no_grad():
            for i, p in enumerate(tensors):
                # One whole tensor at a time.
                whole = torch.empty(p.shape, dtype=torch.float32, device=self.device)
                if blobs is not None:
                    whole.copy_(from_f32(blobs[i], p.shape))
                self.g.broadcast(whole, 0)
                self.sharded.load(i, whole)

    def optimizer(self, layouts: List[Dict], opts: Dict) -> distro.DeMo:
        return distro.DeMo(self.shares(layouts), opts, self.device)

    def held_bytes(self) -> int:
        return self.sharded.local_bytes() + self.demo.state_bytes()

    def compile(self) -> bool:
        if self.rank == 0:
            say("the sharded model runs eagerly (torch.compile is for one device or data parallel)")
        return False

    def computes_empty_shares(self) -> bool:
        # FSDP gathers each block's parameters with every rank: a rank
        # without sequences runs an empty share. (A rank out of memory
        # mid-pass leaves the others in FSDP's collectives: the worker ends
        # when they time out.)
        return True

    def entering_collectives(self) -> None:
        self.g.enter()

    def fill_missing_grads(self) -> None:
        """FSDP reduce-scatters every gradient, whatever a rank computed."""

    def shares(self, layouts: List[Dict]) -> List[Dict]:
        """This rank's share of each tensor for DisTrO (its gradient and
        state, the part of the frame it computes): a contiguous range of
        the tensor's rows of tiles (contiguous in memory too), as a layout
        of its own. Not FSDP's row chunks: those need not end on a tile."""
        own = []
        self.cuts, self.tile_cuts = [], []
        for d in layouts:
            outer, rows, cols = int(d["outer"]), int(d["rows"]), int(d["cols"])
            th, tw = int(d["th"]), int(d["tw"])
            tile_rows = outer * rows // th
            bounds = [split_rows(tile_rows, self.g.world, r)[0] for r in range(self.g.world)] + [tile_rows]
            self.cuts.append([b * th * cols for b in bounds])
            self.tile_cuts.append([b * (cols // tw) for b in bounds])
            a, b = bounds[self.rank], bounds[self.rank + 1]
            own.append({"shape": [(b - a) * th * cols], "outer": 1, "rows": (b - a) * th, "cols": cols,
                        "th": th, "tw": tw, "k": int(d["k"])})
        return own

    def share(self, t: torch.Tensor, i: int) -> torch.Tensor:
        """This rank's share of tensor i (t, any shape), a flat view."""
        return t.view(-1)[self.cuts[i][self.rank]:self.cuts[i][self.rank + 1]]

    def gather_shares(self, ts: Sequence[torch.Tensor], first: int = 0) -> None:
        """Every rank's updated share of each tensor in ts (tensors first,
        first+1, ...), to every rank: one all_gather_into_tensor a tensor,
        the shares padded to the largest."""
        for i, t in enumerate(ts, start=first):
            flat = t.view(-1)
            cuts = self.cuts[i]
            m = max(cuts[r + 1] - cuts[r] for r in range(self.g.world))
            if m == 0:
                continue
            mine = torch.zeros(m, dtype=flat.dtype, device=flat.device)
            mine[:cuts[self.rank + 1] - cuts[self.rank]] = flat[cuts[self.rank]:cuts[self.rank + 1]]
            out = torch.empty(self.g.world * m, dtype=flat.dtype, device=flat.device)
            self.g.all_gather_into(out, mine)
            for r in range(self.g.world):
                flat[cuts[r]:cuts[r + 1]] = out[r * m:r * m + cuts[r + 1] - cuts[r]]

    def gradient(self, x: torch.Tensor, y: torch.Tensor) -> Tuple[float, torch.Tensor]:
        self.own_grads = []
        loss, seq = self.rank_losses(x, y, True)
        # FSDP reduce-scattered the gradient into row chunks; DisTrO's
        # shares are other rows (shares): each tensor gathered whole in
        # turn, this rank keeps its share.
        self.own_grads = [self.share(self.sharded.full_grad(i), i).clone() for i in range(len(self.shapes))]
        self.sharded.drop_grads()
        return loss, seq

    def drop_grads(self) -> None:
        super().drop_grads()
        self.sharded.drop_grads()

    def step(self, lr: float) -> List[bytes]:
        def all_sum(t: torch.Tensor) -> torch.Tensor:
            t = t.reshape(1)
            self.g.all_reduce(t)
            return t[0]
        try:
            out = self.demo.step(self.own_grads, lr, all_sum)
        except distro.NonFinite as exc:
            raise Refused(Kind.NONFINITE, str(exc) or "the gradient is not finite")
        # Every rank's entries to every rank (one all_gather of indices, one
        # of values, each padded to the largest share); rank 0 keeps them.
        world = self.g.world
        counts = [[(tc[r + 1] - tc[r]) * int(l.k) for tc, l in zip(self.tile_cuts, self.demo.layouts)]
                  for r in range(world)]
        width = max(sum(c) for c in counts)
        idx = torch.zeros(width, dtype=torch.int32, device=self.device)
        vals = torch.zeros(width, dtype=torch.float32, device=self.device)
        n = sum(counts[self.rank])
        if n:
            idx[:n] = torch.cat([o[0] for o in out])
            vals[:n] = torch.cat([o[1] for o in out])
        all_idx = self.all_ranks(idx)
        all_vals = self.all_ranks(vals)
        if self.rank != 0:
            return []
        parts_i = [list(torch.split(all_idx[r][:sum(counts[r])], counts[r])) for r in range(world)]
        parts_v = [list(torch.split(all_vals[r][:sum(counts[r])], counts[r])) for r in range(world)]
        blobs = []
        for i in range(len(self.shapes)):
            blobs += [u32_bytes(torch.cat([parts_i[r][i] for r in range(world)])),
                      f32_bytes(torch.cat([parts_v[r][i] for r in range(world)]))]
        return blobs

    def own_combined(self, comb: Combined) -> Combined:
        """This rank's entries of a round's aggregate: those in its tiles,
        renumbered from its first."""
        out = []
        for i, (tiles, index, vals) in enumerate(comb):
            lo, hi = self.tile_cuts[i][self.rank], self.tile_cuts[i][self.rank + 1]
            e0, e1 = torch.searchsorted(tiles, torch.tensor([lo, hi], dtype=torch.int64, device=tiles.device)).tolist()
            out.append((tiles[e0:e1] - lo, index[e0:e1], vals[e0:e1]))
        return out

    def apply(self, comb: Combined, lr: float) -> None:
        # Each tensor whole in turn: this rank updates its share, the
        # shares are gathered, and each rank keeps its FSDP rows.
        self.demo.check_values(comb)
        for i, own in enumerate(self.own_combined(comb)):
            full = self.sharded.full(i)
            self.demo.apply_one(i, self.share(full, i), own, lr)
            self.gather_shares([full], i)
            self.sharded.load(i, full)

    def locals(self) -> List[torch.Tensor]:
        return self.sharded.locals()

    def whole_tensors(self) -> Iterator[torch.Tensor]:
        for i in range(len(self.shapes)):
            yield self.sharded.full(i)

    def whole_tensor(self, i: int) -> torch.Tensor:
        # Gathered from every rank's shard (every rank reads).
        return self.sharded.full(i)

    def grads(self) -> List[bytes]:
        full = [torch.zeros(s, dtype=torch.float32, device=self.device) for s in self.shapes]
        for i, (f, g) in enumerate(zip(full, self.own_grads)):
            self.share(f, i).copy_(g)
        self.gather_shares(full)
        return [f32_bytes(f) for f in full]

    def set_grads(self, blobs: Optional[List[bytes]]) -> None:
        self.own_grads = []
        for i, s in enumerate(self.shapes):
            if blobs is not None:
                g = from_f32(blobs[i], s).to(self.device)
            else:
                g = torch.empty(s, dtype=torch.float32, device=self.device)
            self.g.broadcast(g, 0)
            self.own_grads.append(self.share(g, i).clone())


def estimate(h: Dict, world: int) -> Tuple[int, int]:
    """Bytes a device needs for the model of an open request: (data
    parallel, sharded over world ranks). Parameters, the gradient and
    DisTrO's state are float32; the activations are a rough count for one
    sequence of the full context (what a batch of one per rank needs, at
    least)."""
    shapes = h["shapes"]
    n = sum(math.prod(s) for s in shapes)
    state = 4 * n * (2 if h["distro"].get("normalize_rms") else 1)
    c = h["config"]
    width, layers, ctx = int(c["width"]), int(c["layers"]), int(c["context"])
    # A transformers model's MLP width is its config.json's
    # (intermediate_size, or GPT-2's n_inner); left out, the GPT's 4x.
    spec = json.loads(c["json"]) if "json" in c else c
    inner = int(spec.get("intermediate") or spec.get("intermediate_size") or spec.get("n_inner") or 4 * width)
    act = 4 * ctx * (layers * (16 * width + 4 * inner + int(c["heads"]) * ctx) + 3 * int(c["vocab"]))
    # Sharded, a rank holds 1/world of the parameters, the gradient and
    # the state, and whole while stepping: one tensor and its gradient.
    largest = max((math.prod(s) for s in shapes), default=0)
    return 8 * n + state + act, (8 * n + state) // world + 8 * largest + act


def choose(device: torch.device, g, h: Dict) -> Single:
    """The placement of an open request's model: one device without ranks;
    with them, data parallel when the model fits each device, else sharded
    (the request's "placement", tests, overrides). The ranks decide alike:
    on the smallest free memory among them."""
    if g is None:
        return Single(device)
    import torch.distributed as dist  # noqa: E402  (only ranks need it)
    free = float("inf")
    if device.type == "cuda":
        free = float(torch.cuda.mem_get_info(device)[0])
    t = torch.tensor([free], dtype=torch.float64)
    g.all_reduce(t, dist.ReduceOp.MIN)
    free = float(t[0])
    replicate, shard = estimate(h, g.world)
    want = h.get("placement") or "auto"
    if want == "replicate":
        kind = Replicated
    elif want == "shard":
        kind = Sharded
    else:
        kind = Replicated if replicate <= 0.9 * free else Sharded
    if g.rank == 0:
        need = replicate if kind is Replicated else shard
        what = "each device holds the model, its gradient and DisTrO state" if kind is Replicated else \
            ("each device holds 1/%d of every parameter (fully_shard per transformer block: a block's "
             "parameters whole only while it computes), of the gradient and of the DisTrO state, and one "
             "tensor whole while stepping" % g.world)
        room = "unlimited on the CPU" if free == float("inf") else "%.2f GiB free on the smallest" % (free / 2**30)
        say("%s over %d ranks: %s; about %.2f GiB a device (%s)%s" % (
            kind.name, g.world, what, need / 2**30, room,
            "" if need <= free else "; more than a device has: expect it to run out of memory"))
    return kind(device, g)
