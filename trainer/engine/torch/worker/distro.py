"""DisTrO (DeMo) on the device, for the PyTorch worker.

This is Go's distro.DeMo (distro/demo.go) with torch ops: the momentum,
the gradient's running mean squares and the parameters stay on the device,
and what crosses to psyche each round is a frame's entries (step) and a
round's combined coefficients (apply). Every decision of the aggregation
rule (canonical order, dissenters, clipping, trimmed means, votes,
duplicate indices) is made once, in Go, by distro.Plan.Combine; apply only
scatters its output, inverts the DCT and takes the sign.

A tensor is cut as Go's distro.TileLayout says: viewed as outer x rows x
cols, tiles of th x tw, tile t = (o*tilesR + tr)*tilesC + tc, an index
within a tile row-major. The state is kept tile-major: one [tiles, th*tw]
float32 tensor per parameter tensor (each tile's coefficients column-major
inside, see _Layout; frames and aggregates use Go's row-major indices).

Arithmetic follows Go's, operation by operation and rounding by rounding,
where torch allows it: the scalars (lr, decay, weight decay, clip, the bias
correction) are rounded to float32 as Go holds them; the momentum is
beta*m + scale*c with each product rounded (no fused multiply-add); the
mean squares are folded in float64; top-k breaks ties towards the lower
index; apply computes theta*keep rounded, then subtracts lr*s (exact). What
cannot be the same is the DCT: Go uses Lee's fast algorithm, this matrix
products with orthonormal bases, so coefficients differ by a few
float32 ulps, and a coefficient within that of another at the k-th place
of a tile (a near-tie) may be chosen differently, as may the sign of an
inverse-DCT output within that of zero.

Runs on the CPU and CUDA; needs torch (2.6 or newer) and numpy only.
"""

import math

import numpy as np
import torch

# distro's NormalizeRMS constants: normBeta, 1 - normBeta (Go evaluates the
# constant exactly, then rounds: the literal 0.05, not 1 - 0.95 in float64)
# and normFloor.
NORM_BETA = 0.95
NORM_W = 0.05
NORM_FLOOR = 0.1

# Tiles are processed this many coefficients at a time on a GPU (64 MiB of
# float32), and a sixteenth of that on CPU: there a chunk's temporaries (the
# RMS normalization's are float64, 8 bytes a coefficient, several at once)
# stay a few MiB each, which the C allocator reuses instead of keeping them
# resident beside the model, and stay in cache. (A 0.5B step's peak was 0.2-0.45
# GiB above its start at a quarter, nothing at a sixteenth, and no slower.)
CHUNK_ELEMS = 1 << 24
CPU_CHUNK_ELEMS = 1 << 20
# A gradient's sum of squares adds float64 dot products of this many values
# on CPU: the grouping of the sum, so the clip's norm, depends on it.
CPU_SUM_ELEMS = 1 << 18


class NonFinite(Exception):
    """The gradient has NaN or Inf in it (Go's distro.ErrNonFinite)."""


def f32(x):
    """x rounded to float32 (as a Python float), as Go holds it."""
    return float(np.float32(x))


def go_pow(x, n):
    """Go's math.Pow(x, n) for an integer n >= 1 and finite x > 0, operation by
    operation (it is not correctly rounded, and C's pow may differ from it in
    the last bit): the bias correction of NormalizeRMS must be Go's."""
    if n == 1 or x == 1:
        return x if n == 1 else 1.0
    a1, ae = 1.0, 0
    x1, xe = math.frexp(x)
    i = int(n)
    while i != 0:
        if xe < -(1 << 12) or (1 << 12) < xe:
            ae += xe
            break
        if i & 1:
            a1 *= x1
            ae += xe
        x1 *= x1
        xe <<= 1
        if x1 < 0.5:
            x1 += x1
            xe -= 1
        i >>= 1
    try:
        return math.ldexp(a1, ae)
    except OverflowError:
        return math.inf


def dct_basis(n, device):
    """The orthonormal DCT-II matrix of length n (row k is the k-th basis
    vector: D @ x is the transform, D.T @ X its inverse), built in float64,
    entries that are mathematically 0 (cos of an odd multiple of pi/2) set
    to exactly 0, then rounded to float32."""
    k = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    m = torch.cos(math.pi * (2 * i + 1) * k / (2 * n))
    # (2i+1)k/(2n) is an odd multiple of 1/2 exactly when (2i+1)k is an odd
    # multiple of n: decide in integers, not by the size of the float.
    ki = torch.arange(n, dtype=torch.int64)[:, None]
    ii = torch.arange(n, dtype=torch.int64)[None, :]
    num = (2 * ii + 1) * ki
    zero = (num % n == 0) & ((num // n) % 2 == 1)
    m[zero] = 0
    m[0] *= math.sqrt(1 / n)
    m[1:] *= math.sqrt(2 / n)
    return m.to(torch.float32).to(device)


class _HighestPrecision:
    """float32 matrix products in full float32 (no TF32 on CUDA, no bf16)
    while DeMo runs, whatever the model's training set; restored after.
    Only torch's public setting is touched, never the backend flags behind it (allow_tf32, and the per-backend fp32_precision
    of newer torch, which refuses to see the two kinds mixed)."""

    def __enter__(self):
        self.prec = None
        prec = torch.get_float32_matmul_precision()
        if prec != "highest":
            self.prec = prec
            torch.set_float32_matmul_precision("highest")
        return self

    def __exit__(self, *exc):
        if self.prec is not None:
            torch.set_float32_matmul_precision(self.prec)
        return False


class _Layout:
    """One tensor's tiles (Go's TileLayout) and its transforms.

    The DCT runs as two plain matrix products on tall matrices (batched
    products of 64x64 tiles are several times slower on CPU): along the
    columns of the tensor in its own layout, then, once the tiles are cut
    out transposed, along their rows. So the state keeps each tile's
    coefficients column-major: position p = kw*th + kh holds the
    coefficient Go indexes kh*tw + kw (the same when th or tw is 1)."""

    def __init__(self, d, bases, device, chunk_elems):
        self.shape = [int(s) for s in d["shape"]]
        self.outer, self.rows, self.cols = int(d["outer"]), int(d["rows"]), int(d["cols"])
        self.th, self.tw, self.k = int(d["th"]), int(d["tw"]), int(d["k"])
        if self.outer * self.rows * self.cols != math.prod(self.shape) or self.rows % self.th or self.cols % self.tw \
                or not 1 <= self.k <= self.th * self.tw:
            raise ValueError("distro: inconsistent layout %r" % (d,))
        self.tiles_r, self.tiles_c = self.rows // self.th, self.cols // self.tw
        self.ts = self.th * self.tw
        self.tiles = self.outer * self.tiles_r * self.tiles_c
        self.numel = self.outer * self.rows * self.cols
        for n in (self.th, self.tw):
            if n > 1 and n not in bases:
                bases[n] = dct_basis(n, device)
        self.dh = bases.get(self.th)  # None for 1: the transform is the identity
        self.dw = bases.get(self.tw)
        self.dh_t = self.dh.t().contiguous() if self.dh is not None else None
        self.dw_t = self.dw.t().contiguous() if self.dw is not None else None
        # Go's index of each position, and the position of each Go index
        # (None when they are the same).
        self.index_of = self.pos_of = None
        if self.th > 1 and self.tw > 1:
            p = torch.arange(self.ts, device=device)
            self.index_of = (p % self.th) * self.tw + p // self.th
            self.pos_of = (p % self.tw) * self.th + p // self.tw
        # tile rows (of tiles_c tiles each) per chunk
        self.rows_per_chunk = max(1, chunk_elems // max(1, self.tiles_c * self.ts))

    def blocks(self, x):
        """x (numel values, contiguous) as [outer*tiles_r, th, tiles_c, tw]:
        a view whose [r, :, c, :] is tile r*tiles_c + c."""
        return x.view(self.outer * self.tiles_r, self.th, self.tiles_c, self.tw)

    def chunks(self):
        """Ranges [a, b) of tile rows, covering tiles a*tiles_c to b*tiles_c."""
        n = self.outer * self.tiles_r
        for a in range(0, n, self.rows_per_chunk):
            yield a, min(n, a + self.rows_per_chunk)

    def forward(self, x):
        """The DCT of the tile rows x [r, th, tiles_c, tw] (a view of the
        tensor): [r*tiles_c, ts] coefficients, column-major in each tile, in
        a new tensor."""
        r = x.shape[0]
        n = r * self.tiles_c
        if self.dw is not None:
            x = (x.reshape(-1, self.tw) @ self.dw_t).view(r, self.th, self.tiles_c, self.tw)
        # cut the tiles out, transposed: [r, tiles_c, tw, th]
        x = x.permute(0, 2, 3, 1)
        if self.dh is not None:
            return (x.reshape(-1, self.th) @ self.dh_t).view(n, self.ts)
        if self.dw is None:
            return x.reshape(n, self.ts).clone()  # 1x1 tiles: x is the gradient itself
        return x.reshape(n, self.ts)

    def inverse(self, c):
        """The inverse DCT of coefficients c [r*tiles_c, ts] (column-major in
        each tile): the tile rows [r, th, tiles_c, tw], in a new tensor."""
        r = c.shape[0] // self.tiles_c
        if self.dh is not None:
            c = c.view(-1, self.th) @ self.dh
        x = c.view(r, self.tiles_c, self.tw, self.th).permute(0, 3, 1, 2)
        if self.dw is not None:
            return (x.reshape(-1, self.tw) @ self.dw).view(r, self.th, self.tiles_c, self.tw)
        return x.reshape(r, self.th, self.tiles_c, self.tw)


def top_k(mag, k, index_of=None):
    """The k largest entries of each row of mag [n, ts] (finite, >= 0), ties
    to the lower index, as Go's topK: returns (positions, indices) [n, k],
    the indices ascending in each row. An entry's index is index_of[position]
    (the position itself if None): the order Go breaks ties in.
    torch.topk promises no order among equal values, so the rows where the
    k-th and the (k+1)-th largest are equal are chosen again on a key that
    is unique in the row (the magnitude's bits above the reversed index)."""
    n, ts = mag.shape
    if k >= ts:
        pos = torch.arange(ts, device=mag.device).expand(n, ts)
    else:
        vals, pos = torch.topk(mag, k + 1, dim=1)
        pos = pos[:, :k]
        tied = (vals[:, k - 1] == vals[:, k]).nonzero().squeeze(1)
        if tied.numel():
            index = index_of if index_of is not None else torch.arange(ts, device=mag.device)
            key = (mag.index_select(0, tied).view(torch.int32).to(torch.int64) << 32) | (ts - 1 - index)
            pos[tied] = torch.topk(key, k, dim=1).indices
    if index_of is None:
        pos = torch.sort(pos, dim=1).values
        return pos, pos
    idx, order = torch.sort(index_of[pos], dim=1)
    return pos.gather(1, order), idx


class DeMo:
    """One trainer's DisTrO optimizer state on a device (Go's distro.DeMo less
    the aggregation, which Go's Plan.Combine does)."""

    def __init__(self, layouts, opts, device, state=True):
        self.device = torch.device(device)
        self.decay = f32(opts["decay"])
        self.weight_decay = f32(opts.get("weight_decay", 0.0))
        self.clip = f32(opts.get("clip", 0.0))
        self.quantize = bool(opts.get("quantize", False))
        self.normalize = bool(opts.get("normalize_rms", False))
        # The bound on a frame's float values (Go's distro.MaxValue, 2^40,
        # sent by psyche: the one definition): step clamps what it sends to
        # it, and apply refuses a combined value beyond it.
        if "max_value" not in opts:
            raise ValueError("distro: psyche sent no max_value (a frame's bound on its values)")
        self.max_value = f32(opts["max_value"])
        if not 0 < self.max_value < math.inf:
            raise ValueError("distro: max_value %r is not positive and finite" % (opts["max_value"],))
        if not (0 <= self.decay < 1) or not self.weight_decay >= 0 or not self.clip >= 0:
            raise ValueError("distro: need 0 <= decay < 1, weight decay >= 0 and clip >= 0")
        # Tiles are processed this many coefficients at a time: the
        # temporaries of a step or an apply are bounded by it whatever the
        # size of a tensor (on CPU, smaller pieces stay in cache).
        self.chunk_elems = CHUNK_ELEMS if self.device.type != "cpu" else CPU_CHUNK_ELEMS
        self.bases = {}
        self.layouts = [_Layout(d, self.bases, self.device, self.chunk_elems) for d in layouts]
        # state=False: a rank of a data-parallel worker that applies rounds
        # but never steps (rank 0 does) keeps no momentum.
        self.delta = [torch.zeros(l.tiles if state else 0, l.ts, dtype=torch.float32, device=self.device)
                      for l in self.layouts]
        self.mean_sq = [torch.zeros_like(d) for d in self.delta] if self.normalize else None
        self.steps = 0

    def momentum(self, i):
        """Tensor i's momentum in the DCT domain, [tiles, th*tw], each tile
        row-major as Go's DeMo.Momentum (a copy: the state keeps tiles
        column-major)."""
        l = self.layouts[i]
        if l.pos_of is None:
            return self.delta[i].clone()
        return self.delta[i][:, l.pos_of]

    def state_bytes(self):
        """Device memory the state holds, in bytes."""
        n = sum(t.numel() * t.element_size() for t in self.delta)
        if self.mean_sq is not None:
            n += sum(t.numel() * t.element_size() for t in self.mean_sq)
        n += sum(b.numel() * b.element_size() for b in self.bases.values())
        return n

    def _check(self, what, ts):
        if len(ts) != len(self.layouts):
            raise ValueError("distro: %d %s tensors, the model has %d" % (len(ts), what, len(self.layouts)))
        for i, (t, l) in enumerate(zip(ts, self.layouts)):
            if t.numel() != l.numel:
                raise ValueError("distro: %s tensor %d has %d values, shape %s needs %d" % (what, i, t.numel(), l.shape, l.numel))

    def _sum_squares(self, g):
        """sum of g*g in float64 (each square exact), a 0-dim device tensor."""
        flat = g.reshape(-1)
        s = torch.zeros((), dtype=torch.float64, device=g.device)
        n = CPU_SUM_ELEMS if self.device.type == "cpu" else self.chunk_elems
        for a in range(0, flat.numel(), n):
            x = flat[a:a + n].to(torch.float64)
            s = s + torch.dot(x, x)
        return s

    @torch.no_grad()
    def step(self, grads, lr, all_sum=None):
        """Folds grads into the momentum and returns, per tensor, the top-k
        indices (int32, tiles*k, ascending within each tile) and values
        (float32; +-1 in 1-bit runs), on the device: what distro.Plan.FrameOf
        takes. Raises NonFinite (and changes nothing) if a gradient has NaN or
        Inf in it."""
        self._check("gradient", grads)
        lr = f32(lr)
        grads = [g.detach() for g in grads]
        # One sync: the norm is finite exactly when every gradient is (a
        # float32's square cannot overflow a float64, nor can their sum).
        # all_sum adds a 0-dim float64 tensor over the ranks of a sharded
        # worker (each holds a share of the gradient; the clip needs its
        # whole norm).
        total = torch.stack([self._sum_squares(g) for g in grads]).sum() if grads else \
            torch.zeros((), dtype=torch.float64, device=self.device)
        if all_sum is not None:
            total = all_sum(total)
        total = float(total)
        if not math.isfinite(total):
            raise NonFinite("distro: gradient is not finite")
        norm = math.sqrt(total)
        scale = lr
        if self.clip > 0 and norm > self.clip:
            scale = f32(lr * self.clip / norm)
        self.steps += 1
        unbias = f32(1 / (1 - go_pow(NORM_BETA, self.steps)))
        out = []
        with _HighestPrecision():
            for i, (g, l) in enumerate(zip(grads, self.layouts)):
                out.append(self._step_tensor(i, l, g, scale, unbias))
        return out

    def _step_tensor(self, i, l, g, scale, unbias):
        g = l.blocks(g.to(torch.float32).contiguous())
        delta = self.delta[i]
        idx_out, val_out = [], []
        for a, b in l.chunks():
            t0, t1 = a * l.tiles_c, b * l.tiles_c
            c = l.forward(g[a:b])
            if self.normalize:
                c = self._normalize(c, self.mean_sq[i][t0:t1], unbias, l.ts)
            m = delta[t0:t1]
            # m = beta*m + scale*c, each product rounded (Go's momentum)
            c.mul_(scale)
            m.mul_(self.decay).add_(c)
            pos, idx = top_k(m.abs(), l.k, l.index_of)
            vals = m.gather(1, pos)
            # The residual keeps what was not sent, unquantized; a float
            # value beyond max_value is sent as +-max_value and the excess
            # kept (Go's Step: v - v is +0, as the 0 a 1-bit run leaves).
            if self.quantize:
                m.scatter_(1, pos, 0.0)
                vals = torch.where(vals < 0, -torch.ones_like(vals), torch.ones_like(vals))
            else:
                sent = vals.clamp(-self.max_value, self.max_value)
                m.scatter_(1, pos, vals - sent)
                vals = sent
            idx_out.append(idx.to(torch.int32).reshape(-1))
            val_out.append(vals.reshape(-1))
        if not idx_out:  # a rank's share of this tensor is empty
            return torch.zeros(0, dtype=torch.int32, device=self.device), torch.zeros(0, device=self.device)
        if len(idx_out) == 1:
            return idx_out[0], val_out[0]
        return torch.cat(idx_out), torch.cat(val_out)

    @staticmethod
    def _normalize(c, v, unbias, ts):
        """Go's normalizeTile on every tile (row) of c: folds c*c into the
        running mean squares v (in float64, kept as float32) and returns c
        divided by sqrt(v*unbias) + floor, where floor is NORM_FLOOR times
        the root of the tile's bias-corrected mean; a tile whose floor is 0 is
        all zero."""
        c64 = c.to(torch.float64)
        sq = c64.mul(NORM_W).mul_(c64)  # (w*x)*x, as Go
        m64 = v.to(torch.float64).mul_(NORM_BETA).add_(sq)
        v.copy_(m64)
        total = m64.sum(dim=1)
        floor = (NORM_FLOOR * torch.sqrt(total / ts * unbias)).to(torch.float32)
        denom = torch.sqrt(v * unbias).add_(floor[:, None])
        out = c / denom
        return torch.where(floor[:, None] == 0, torch.zeros_like(out), out)

    @torch.no_grad()
    def apply(self, params, combined, lr):
        """Applies a round's combined coefficients (per tensor: tiles int64,
        index int64, values float32 on the device, Go's CombinedTensor) to
        params in place: theta <- theta*keep - lr*sign(IDCT(tile)), keep = 1 -
        lr*wd in float32, as Go's Apply."""
        self._check("parameter", params)
        if len(combined) != len(self.layouts):
            raise ValueError("distro: %d combined tensors, the model has %d" % (len(combined), len(self.layouts)))
        # Go's decoder refuses a frame value beyond max_value and every rule
        # combines values into one within them, so the inverse DCT below
        # cannot overflow (distro.MaxValue says why). A combined value
        # beyond it (or NaN) is psyche's fault: refused, one sync, before
        # any parameter moves.
        self.check_values(combined)
        lr, keep = self._rates(lr)
        with _HighestPrecision():
            for p, comb, l in zip(params, combined, self.layouts):
                self._apply_tensor(p, comb, l, lr, keep)

    def check_values(self, combined):
        vals = [v for _, _, v in combined if v.numel()]
        if vals and not bool(torch.stack([(v.abs() <= self.max_value).all() for v in vals]).all()):
            raise ValueError("distro: a combined value beyond +-%g (distro.MaxValue) or not a number" % self.max_value)

    def _rates(self, lr):
        lr32 = np.float32(lr)
        return float(lr32), float(np.float32(1) - lr32 * np.float32(self.weight_decay))

    @torch.no_grad()
    def apply_one(self, i, p, comb, lr):
        """apply for tensor i alone, its combined values already checked
        (check_values): a sharded worker holds one whole tensor at a time."""
        lr, keep = self._rates(lr)
        with _HighestPrecision():
            self._apply_tensor(p, comb, self.layouts[i], lr, keep)

    def _apply_tensor(self, p, comb, l, lr, keep):
        tiles, index, values = comb
        if not (tiles.shape == index.shape == values.shape) or tiles.dim() != 1:
            raise ValueError("distro: combined tiles, index and values of shapes %s, %s, %s"
                             % (tuple(tiles.shape), tuple(index.shape), tuple(values.shape)))
        tiles = tiles.to(self.device, torch.int64)
        index = index.to(self.device, torch.int64)
        values = values.to(self.device, torch.float32)
        # Entries are sorted by tile: each chunk's are a contiguous range.
        # One sync: the ranges, and whether every entry is inside the tensor
        # (a bad index would be a device-side assert on CUDA).
        bounds = [a * l.tiles_c for a, _ in l.chunks()] + [l.tiles]
        if tiles.numel():
            cuts = torch.searchsorted(tiles, torch.tensor(bounds, dtype=torch.int64, device=self.device))
            bad = ((tiles < 0) | (tiles >= l.tiles) | (index < 0) | (index >= l.ts)).any()
            got = torch.cat([cuts, bad.to(torch.int64).view(1)]).tolist()
            cuts = got[:-1]
            if got[-1] or cuts[-1] != tiles.numel():
                raise ValueError("distro: combined entries outside the tensor's %d tiles of %d" % (l.tiles, l.ts))
        else:
            cuts = [0] * len(bounds)
        target = p.detach()
        if not target.is_contiguous():
            work = target.contiguous()
            self._update(work, tiles, index, values, cuts, l, lr, keep)
            target.copy_(work)
        else:
            self._update(target, tiles, index, values, cuts, l, lr, keep)

    def _update(self, target, tiles, index, values, cuts, l, lr, keep):
        blocks = l.blocks(target)
        for j, (a, b) in enumerate(l.chunks()):
            t0, t1 = a * l.tiles_c, b * l.tiles_c
            e0, e1 = cuts[j], cuts[j + 1]
            dense = torch.zeros((t1 - t0) * l.ts, dtype=torch.float32, device=self.device)
            if e1 > e0:
                ix = index[e0:e1]
                if l.pos_of is not None:
                    ix = l.pos_of[ix]
                dense[(tiles[e0:e1] - t0) * l.ts + ix] = values[e0:e1]
            x = l.inverse(dense.view(t1 - t0, l.ts))  # [b-a, th, tiles_c, tw], the tensor's own layout
            # Go's signs: -1, +1, and +0 for +-0. They differ on NaN (Go
            # takes its sign bit, +-1; torch gives 0), which only an inverse
            # DCT that overflows gives: values within max_value cannot.
            s = torch.sign(x).mul_(lr)
            view = blocks[a:b]
            if view.dtype == torch.float32:
                if keep != 1.0:
                    view.mul_(keep)
                view.sub_(s)
            else:  # a lower-precision parameter: the update in float32, rounded once
                w = view.to(torch.float32)
                if keep != 1.0:
                    w.mul_(keep)
                view.copy_(w.sub_(s))
