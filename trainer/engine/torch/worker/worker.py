"""psyche's PyTorch worker: the engine's half that runs next to torch.

psyche starts this file (embedded in its binary) and drives it over two
pipes: requests arrive on fd 3, answers leave on fd 4 (the framing and
every constant the two sides share: protocol.py and protocol.json; the Go
side is trainer/engine/torch/wire.go and protocol.go). The worker holds one model
(models.py), its gradient and its DisTrO state (distro.py) on one torch
device and answers one request at a time. It exits when fd 3 closes.
stdout and stderr are free for torch's own output; lines starting with
"psyche-worker: " are what psyche logs at info level.
"""

import json
import math
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol  # noqa: E402  (beside this file; the standard library only)
from protocol import Kind, Refused, read_message, say, write_message  # noqa: E402

# A python that cannot run the worker says so in its answer to psyche's
# hello, naming every module it lacks at once (so that the user installs
# them together), and psyche tries its next python.
_missing = []
for _name in ("numpy", "torch"):
    try:
        __import__(_name)
    except ImportError:
        _missing.append(_name)
if _missing:
    protocol.refuse_start("missing python modules: " + " ".join(_missing), modules=_missing)
import numpy as np  # noqa: E402
import torch  # noqa: E402

# The oldest torch the worker runs on (protocol.json's min_torch):
# transformers 5 needs it, and it is the first with FSDP2's fully_shard
# under torch.distributed.fsdp. An older one (Debian bookworm's
# python3-torch is 1.13) is refused like a missing one. torch.__version__
# compares as a version, not as text.
if torch.__version__ < protocol.MIN_TORCH:
    protocol.refuse_start("torch %s is older than %s" % (torch.__version__, protocol.MIN_TORCH), torch=str(torch.__version__))
import distro  # noqa: E402  (beside this file)
import hf  # noqa: E402
import models  # noqa: E402


def f32_bytes(t: "torch.Tensor") -> bytes:
    return t.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False).tobytes()


def u32_bytes(t: "torch.Tensor") -> bytes:
    # int32 and uint32 share their bytes for indices below 2^31 (a tile
    # has at most 2^31 coefficients).
    return t.detach().to("cpu", torch.int32).contiguous().numpy().astype("<i4", copy=False).tobytes()


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    msg = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg)


def resolve_device(dev: str) -> "torch.device":
    """The torch device dev names, checked against this machine."""
    d = torch.device(dev)
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise Refused(Kind.INPUT, "device %s: this torch (%s) sees no CUDA device" % (dev, torch.__version__))
        idx = d.index if d.index is not None else torch.cuda.current_device()
        if idx >= torch.cuda.device_count():
            raise Refused(Kind.INPUT, "device %s: this machine has %d CUDA devices" % (dev, torch.cuda.device_count()))
        return torch.device("cuda", idx)
    if d.type == "mps":
        if not torch.backends.mps.is_available():
            raise Refused(Kind.INPUT, "device mps: this torch (%s) has no usable mps backend" % torch.__version__)
    return d


def resolve_devices(devs) -> list:
    """The devices of a worker: "all" is every CUDA device torch sees."""
    if list(devs) == ["all"]:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise Refused(Kind.INPUT, "devices all: this torch (%s) sees no CUDA device" % torch.__version__)
        return [torch.device("cuda", i) for i in range(n)]
    out = [resolve_device(d) for d in devs]
    if len(out) > 1:
        if len({d.type for d in out}) > 1 or out[0].type not in ("cpu", "cuda"):
            raise Refused(Kind.INPUT, "devices %s: several devices must all be cpu or all cuda:N" % ",".join(devs))
        if out[0].type == "cuda" and len(set(out)) != len(out):
            raise Refused(Kind.INPUT, "devices %s: a CUDA device is named twice" % ",".join(devs))
    return out


def cpu_threads(world: int) -> None:
    """Ranks sharing a machine's cores split them (each would take all)."""
    if world > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // world))


# How the ranks of a multi-device worker hold the model (SHARD: FSDP2,
# fsdp.py).
SINGLE, REPLICATE, SHARD = "single device", "data parallel", "sharded (FSDP2)"
# The most elements one bucketed collective carries (64 MiB of float32).
BUCKET = 1 << 24


class Worker:
    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.model = None
        self.sharded = None  # SHARD: the fsdp.Sharded module holding the parameters
        self.demo = None
        self.amp = None
        self.shapes = []
        self.saved = None  # parameters saved by try (a sharded rank: its shares)
        self.trying = False
        self.has_grad = False
        self.loss_fn = None
        self.tok_fn = None
        self.g = None  # ranks.Group of a multi-device worker
        self.mode = SINGLE
        self.cuts = []  # sharded: per tensor, the element offset of each rank's share (world+1 of them)
        self.tile_cuts = []  # sharded: per tensor, the first tile of each rank's share
        self.own_grads = []  # sharded: this rank's share of each gradient, reduced
        self.timeout = protocol.DEFAULT_TIMEOUT_S

    @property
    def rank(self) -> int:
        return self.g.rank if self.g is not None else 0

    def forwarded(self, op: str) -> bool:
        """Whether the other ranks take part in op (rank 0 alone answers
        hello, describe and stats, and params unless sharded; a data-parallel
        worker's rank 0 alone steps and holds the gradient psyche reads or
        sets)."""
        if self.g is None or op in ("hello", "describe", "stats"):
            return False
        if op == "params":
            return self.mode == SHARD  # gathered from the shards
        if op in ("step", "grads", "set_grads"):
            return self.mode == SHARD
        return True

    # -- requests --------------------------------------------------------

    def hello(self, h, blobs):
        devs = h.get("devices") or [h.get("device", "cpu")]
        devices = resolve_devices(devs)
        self.device = devices[0]
        self.timeout = float(h.get("timeout") or protocol.DEFAULT_TIMEOUT_S)
        names, memory, bf16 = [], [], True
        for d in devices:
            if d.type == "cuda":
                props = torch.cuda.get_device_properties(d.index)
                names.append(props.name)
                memory.append(int(props.total_memory))
                bf16 = bf16 and torch.cuda.is_bf16_supported()
            else:
                names.append("")
                memory.append(0)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if len(devices) > 1:
            import ranks  # noqa: E402  (only a multi-device worker needs torch.distributed)
            cpu_threads(len(devices))
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            self.g = ranks.Group(0, devices, backend, max(self.timeout, 60.0),
                                 os.path.dirname(os.path.abspath(__file__)))
            self.g.launch(os.path.abspath(__file__))
            say("%d ranks on %s (%s)" % (len(devices), ",".join(str(d) for d in devices), backend))
        return {
            "protocol": protocol.VERSION,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "python": sys.version.split()[0],
            "device": ",".join(str(d) for d in devices),
            "devices": [str(d) for d in devices],
            "device_name": names[0],
            "memory": min(memory),
            "pids": self.g.pids() if self.g is not None else [os.getpid()],
            # Every torch the worker accepts has both (the fields stay for
            # psyche's Info).
            "sdpa": True,
            "compile": True,
            "bf16": bf16,
        }, []

    def describe(self, h, blobs):
        try:
            names, shapes = hf.describe(h["config"])
        except hf.Unbuildable as exc:
            raise Refused(Kind.INPUT, str(exc)) from None
        return {"names": names, "shapes": shapes}, []

    def open(self, h, blobs):
        self.shapes = [list(s) for s in h["shapes"]]
        self.mode = SINGLE if self.g is None else self.placement(h)
        # A sharded model's parameters live in fsdp.Sharded, the model
        # itself on the meta device (its arithmetic and shapes); a
        # transformers model's in its own modules, sharded in place
        # (fsdp.ShardedTransformers).
        self.sharded = None
        hf_model = h["arch"] == hf.Transformers.arch
        if hf_model:
            try:
                # Sharded, every rank builds the whole network on the CPU
                # (drawing the one-device worker's weights, on the CPU too),
                # and fully_shard keeps its rows of each on the device.
                self.model = hf.build(h["config"], torch.device("cpu") if self.mode == SHARD else self.device,
                                      h.get("seed"))
            except hf.Unbuildable as exc:
                raise Refused(Kind.INPUT, str(exc)) from None
        else:
            self.model = models.build(h["arch"], h["config"], "meta" if self.mode == SHARD else self.device)
        tensors = self.model.tensors
        nblobs = len(h.get("blobs", []))
        drawn = h.get("seed") is not None and nblobs == 0  # hf.build drew the weights from the seed
        if len(tensors) != len(self.shapes) or (not drawn and nblobs != len(tensors)):
            raise Refused(Kind.INPUT, "the model has %d tensors; psyche sent %d shapes and %d tensors"
                          % (len(tensors), len(self.shapes), nblobs))
        if drawn:
            blobs = None
        for i, p in enumerate(tensors):
            if list(p.shape) != self.shapes[i]:
                raise Refused(Kind.INPUT, "tensor %d has shape %s here, %s in psyche" % (i, list(p.shape), self.shapes[i]))
        if self.mode == SHARD:
            import fsdp  # noqa: E402  (only a sharded worker needs FSDP)
            kind = fsdp.ShardedTransformers if hf_model else fsdp.Sharded
            try:
                self.sharded = kind(self.model, self.device, self.g.world, self.rank, self.g.all_gather_into)
            except fsdp.Unshardable as exc:
                raise Refused(Kind.INPUT, str(exc)) from None
            # Placeholders now (the shapes): the whole tensors are gone.
            tensors = self.model.tensors
        # Drawn and sharded, each rank's shards were cut from its own draw,
        # the same on every rank: nothing to load.
        load = not (drawn and self.sharded is not None)
        with torch.no_grad():
            for i, p in enumerate(tensors if load else []):
                # A sharded rank holds one whole tensor at a time.
                dst = p if self.sharded is None else torch.empty(p.shape, dtype=torch.float32, device=self.device)
                if blobs is not None:
                    dst.copy_(torch.from_numpy(np.frombuffer(blobs[i], dtype="<f4").astype(np.float32)).view(p.shape))
                if self.g is not None:
                    self.g.broadcast(dst, 0)
                if self.sharded is not None:
                    self.sharded.load(i, dst)
        self.amp = torch.bfloat16 if h.get("precision") == "bf16" else None
        self.saved = None
        self.trying = False
        self.has_grad = False
        self.own_grads = []
        layouts = h["layouts"]
        if self.g is None:
            self.demo = distro.DeMo(layouts, h["distro"], self.device)
        else:
            if self.mode == SHARD:
                self.demo = distro.DeMo(self.shares(layouts), h["distro"], self.device)
            else:
                self.demo = distro.DeMo(layouts, h["distro"], self.device, state=self.rank == 0)
        self.loss_fn, self.tok_fn = self.model.forward_losses, self.model.token_losses
        if self.sharded is not None:
            self.tok_fn = self.sharded
        compiled = bool(h.get("compile")) and self.sharded is None
        if h.get("compile") and not compiled and self.rank == 0:
            say("the sharded model runs eagerly (torch.compile is for one device or data parallel)")
        if compiled:
            # torch.compile compiles at a shape's first call (a minute or
            # more on a CPU); the kernels persist in TORCHINDUCTOR_CACHE_DIR
            # (psyche points it at its cache directory: inductorCacheEnv),
            # so that a later worker on the same shapes starts in seconds.
            self.loss_fn = torch.compile(self.model.forward_losses)
            self.tok_fn = torch.compile(self.model.token_losses)
        params = sum(p.numel() for p in tensors)
        mem = self.memory()
        if self.rank == 0:
            say("model of %d parameters on %s (%s%s)%s" % (
                params, ",".join(str(d) for d in self.g.devices) if self.g else self.device,
                "bf16 autocast" if self.amp is not None else "fp32",
                ", compiled" if compiled else "", ", %.2f GiB allocated" % (mem / 2**30) if mem else ""))
        if self.g is not None:
            self.log_memory()
        return {"params": params, "memory": mem, "placement": self.mode}, []

    def estimate(self, h):
        """Bytes a device needs for the model: (data parallel, sharded).
        Parameters, the gradient and DisTrO's state are float32; the
        activations are a rough count for one sequence of the full context
        (what a batch of one per rank needs, at least)."""
        n = sum(math.prod(s) for s in self.shapes)
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
        largest = max((math.prod(s) for s in self.shapes), default=0)
        return 8 * n + state + act, (8 * n + state) // self.g.world + 8 * largest + act

    def placement(self, h):
        """Data parallel when the model fits each device, else sharded; the
        request's placement (tests) overrides. The ranks decide alike: on
        the smallest free memory among them."""
        free = float("inf")
        if self.device.type == "cuda":
            free = float(torch.cuda.mem_get_info(self.device)[0])
        t = torch.tensor([free], dtype=torch.float64)
        self.g.all_reduce(t, dist_min())
        free = float(t[0])
        replicate, shard = self.estimate(h)
        want = h.get("placement") or "auto"
        if want == "replicate":
            mode = REPLICATE
        elif want == "shard":
            mode = SHARD
        else:
            mode = REPLICATE if replicate <= 0.9 * free else SHARD
        if self.rank == 0:
            need = replicate if mode == REPLICATE else shard
            what = "each device holds the model, its gradient and DisTrO state" if mode == REPLICATE else \
                ("each device holds 1/%d of every parameter (fully_shard per transformer block: a block's "
                 "parameters whole only while it computes), of the gradient and of the DisTrO state, and one "
                 "tensor whole while stepping" % self.g.world)
            room = "unlimited on the CPU" if free == float("inf") else "%.2f GiB free on the smallest" % (free / 2**30)
            say("%s over %d ranks: %s; about %.2f GiB a device (%s)%s" % (
                mode, self.g.world, what, need / 2**30, room,
                "" if need <= free else "; more than a device has: expect it to run out of memory"))
        return mode

    def shares(self, layouts):
        """A sharded rank's share of each tensor for DisTrO (its gradient
        and state, the part of the frame it computes): a contiguous range
        of the tensor's rows of tiles (contiguous in memory too), as a
        layout of its own. Not FSDP's row chunks: those need not end on a
        tile."""
        import ranks  # noqa: E402
        own = []
        self.cuts, self.tile_cuts = [], []
        for d in layouts:
            outer, rows, cols = int(d["outer"]), int(d["rows"]), int(d["cols"])
            th, tw = int(d["th"]), int(d["tw"])
            tile_rows = outer * rows // th
            bounds = [ranks.split(tile_rows, self.g.world, r)[0] for r in range(self.g.world)] + [tile_rows]
            self.cuts.append([b * th * cols for b in bounds])
            self.tile_cuts.append([b * (cols // tw) for b in bounds])
            a, b = bounds[self.rank], bounds[self.rank + 1]
            own.append({"shape": [(b - a) * th * cols], "outer": 1, "rows": (b - a) * th, "cols": cols,
                        "th": th, "tw": tw, "k": int(d["k"])})
        return own

    def share(self, t, i):
        """This rank's share of tensor i (t, any shape), a flat view."""
        return t.view(-1)[self.cuts[i][self.rank]:self.cuts[i][self.rank + 1]]

    def gather_shares(self, ts, first=0):
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

    def all_reduce_bucketed(self, ts):
        """Sums each tensor in ts over the ranks in place, in flat buckets
        of up to BUCKET elements (one collective each, not one a tensor)."""
        bucket = []
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

    def log_memory(self):
        """Rank 0 logs what each device holds."""
        if self.sharded is not None:
            held = self.sharded.local_bytes() + self.demo.state_bytes()
        else:
            held = sum(p.numel() * 4 for p in self.model.tensors) + self.demo.state_bytes()
        mem = self.memory() or held
        t = torch.tensor([float(mem)], dtype=torch.float64)
        out = [torch.zeros(1, dtype=torch.float64) for _ in range(self.g.world)]
        self.g.all_gather(out, t)
        if self.rank == 0:
            kind = "allocated" if self.device.type == "cuda" else "parameters and DisTrO state"
            say("memory per device (%s): %s" % (kind, ", ".join(
                "%s %.3f GiB" % (d, float(m[0]) / 2**30) for d, m in zip(self.g.devices, out))))

    def memory(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.memory_allocated(self.device))
        return 0

    def batch(self, h, blobs):
        b, t = int(h["b"]), int(h["t"])
        lens = h.get("blobs", [])
        if len(lens) != 2 or lens[0] != 4 * b * t or lens[1] != 4 * b * t or b <= 0 or t <= 0:
            raise Refused(Kind.INPUT, "a %d×%d batch needs two blobs of %d bytes" % (b, t, 4 * b * t))
        if blobs is None:  # another rank: rank 0 sends the tokens
            x = torch.empty(b, t, dtype=torch.int64, device=self.device)
            y = torch.empty(b, t, dtype=torch.int64, device=self.device)
        else:
            x = torch.from_numpy(np.frombuffer(blobs[0], dtype="<u4").astype(np.int64)).view(b, t).to(self.device)
            y = torch.from_numpy(np.frombuffer(blobs[1], dtype="<u4").astype(np.int64)).view(b, t).to(self.device)
        if self.g is not None:
            self.g.broadcast(x, 0)
            self.g.broadcast(y, 0)
        return x, y

    def need_model(self):
        if self.model is None:
            raise Refused(Kind.INPUT, "no model is open")

    def gradient(self, h, blobs):
        self.need_model()
        x, y = self.batch(h, blobs)
        for p in self.model.tensors:
            p.grad = None
        self.has_grad = False
        self.own_grads = []
        if self.g is None:
            loss, seq = self.loss_fn(x, y, self.amp)
            loss.backward()
            self.has_grad = True
            return {"loss": float(loss.detach().float().item())}, [f32_bytes(seq)]
        loss, seq = self.rank_losses(x, y, True)
        if self.mode == REPLICATE:
            self.all_reduce_bucketed([p.grad for p in self.model.tensors])
        else:
            # FSDP reduce-scattered the gradient into row chunks; DisTrO's
            # shares are other rows (shares): each tensor gathered whole in
            # turn, this rank keeps its share.
            for i in range(len(self.model.tensors)):
                self.own_grads.append(self.share(self.sharded.full_grad(i), i).clone())
            self.sharded.drop_grads()
        self.has_grad = True
        return {"loss": loss}, [f32_bytes(seq)]

    def rank_losses(self, x, y, backward):
        """This rank's share of the batch (contiguous sequences) forward and,
        with backward, backward: the batch's mean loss and every sequence's,
        gathered in order. The rank's loss is its tokens' sum over the
        batch's token count, so that the ranks' gradients sum to the mean's
        (each token's weight 1/n, rounded as the one-device mean rounds it).
        A rank out of memory makes every rank refuse the batch alike."""
        b, t = x.shape
        a, e = split_rows(b, self.g.world, self.rank)
        status = torch.zeros(1, dtype=torch.int64)
        local = torch.zeros((), dtype=torch.float64, device=self.device)
        seq = torch.zeros(0, dtype=torch.float32, device=self.device)
        msg = ""
        try:
            # FSDP gathers each block's parameters with every rank: a
            # sharded rank without sequences runs an empty share. (A
            # sharded rank out of memory mid-pass leaves the others in
            # FSDP's collectives: the worker ends when they time out.)
            if e > a or self.sharded is not None:
                if self.sharded is not None:
                    self.g.enter()
                with torch.set_grad_enabled(backward):
                    tok = self.tok_fn(x[a:e], y[a:e], self.amp).double()
                    local = tok.sum()
                    if backward:
                        (local / (b * t)).to(torch.float32).backward()
                seq = tok.detach().view(e - a, t).mean(dim=1).float()
                local = local.detach()
            if backward and self.sharded is None:
                for p in self.model.tensors:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
        except Exception as exc:
            if not is_oom(exc):
                raise
            status[0], msg = 1, str(exc).strip()
            self.drop_grads()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        codes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.g.world)]
        self.g.all_gather(codes, status)
        bad = [r for r, c in enumerate(codes) if int(c[0])]
        if bad:
            self.drop_grads()
            raise Refused(Kind.OOM, msg if self.rank in bad else
                          "%s ran out of memory" % ", ".join(self.g.name(r) for r in bad))
        total = local.detach().to("cpu", torch.float64).reshape(1)
        self.g.all_reduce(total)
        m = max(split_rows(b, self.g.world, r)[1] - split_rows(b, self.g.world, r)[0] for r in range(self.g.world))
        mine = torch.zeros(m, dtype=torch.float32)
        mine[:e - a] = seq.to("cpu")
        out = [torch.zeros(m, dtype=torch.float32) for _ in range(self.g.world)]
        self.g.all_gather(out, mine)
        seqs = torch.cat([o[:split_rows(b, self.g.world, r)[1] - split_rows(b, self.g.world, r)[0]]
                          for r, o in enumerate(out)])
        return float(np.float32(float(total[0]) / (b * t))), seqs

    def drop_grads(self):
        for p in self.model.tensors:
            p.grad = None
        if self.sharded is not None:
            self.sharded.drop_grads()

    def losses(self, h, blobs):
        self.need_model()
        x, y = self.batch(h, blobs)
        if self.g is None:
            with torch.no_grad():
                loss, seq = self.loss_fn(x, y, self.amp)
            return {"loss": float(loss.detach().float().item())}, [f32_bytes(seq)]
        loss, seq = self.rank_losses(x, y, False)
        return {"loss": loss}, [f32_bytes(seq)]

    def step(self, h, blobs):
        self.need_model()
        if not self.has_grad:
            raise Refused(Kind.INPUT, "step without a gradient")
        if self.mode != SHARD:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.model.tensors]
            try:
                out = self.demo.step(grads, float(h["lr"]))
            except distro.NonFinite as exc:
                raise Refused(Kind.NONFINITE, str(exc) or "the gradient is not finite")
            blobs = []
            for idx, vals in out:
                blobs += [u32_bytes(idx), f32_bytes(vals)]
            return {}, blobs

        def all_sum(t):
            t = t.reshape(1)
            self.g.all_reduce(t)
            return t[0]
        try:
            out = self.demo.step(self.own_grads, float(h["lr"]), all_sum)
        except distro.NonFinite as exc:
            raise Refused(Kind.NONFINITE, str(exc) or "the gradient is not finite")
        # Every rank's entries to every rank (one all_gather of indices, one
        # of values, each padded to the largest share); rank 0 keeps them.
        counts = [[(tc[r + 1] - tc[r]) * int(l.k) for tc, l in zip(self.tile_cuts, self.demo.layouts)]
                  for r in range(self.g.world)]
        width = max(sum(c) for c in counts)
        idx = torch.zeros(width, dtype=torch.int32, device=self.device)
        vals = torch.zeros(width, dtype=torch.float32, device=self.device)
        n = sum(counts[self.rank])
        if n:
            idx[:n] = torch.cat([o[0] for o in out])
            vals[:n] = torch.cat([o[1] for o in out])
        all_idx = [torch.zeros_like(idx) for _ in range(self.g.world)]
        all_vals = [torch.zeros_like(vals) for _ in range(self.g.world)]
        self.g.all_gather(all_idx, idx)
        self.g.all_gather(all_vals, vals)
        if self.rank != 0:
            return {}, []
        parts_i = [list(torch.split(all_idx[r][:sum(counts[r])], counts[r])) for r in range(self.g.world)]
        parts_v = [list(torch.split(all_vals[r][:sum(counts[r])], counts[r])) for r in range(self.g.world)]
        blobs = []
        for i in range(len(self.model.tensors)):
            blobs += [u32_bytes(torch.cat([parts_i[r][i] for r in range(self.g.world)])),
                      f32_bytes(torch.cat([parts_v[r][i] for r in range(self.g.world)]))]
        return {}, blobs

    def combined(self, h, blobs):
        n = len(self.model.tensors)
        lens = h.get("blobs", [])
        if len(lens) != 3 * n:
            raise Refused(Kind.INPUT, "an aggregate of %d blobs for %d tensors" % (len(lens), n))
        counts = [int(lens[3 * i]) // 4 for i in range(n)]
        if blobs is not None:
            ints = [torch.from_numpy(np.frombuffer(blobs[3 * i + j], dtype="<u4").astype(np.int64))
                    for i in range(n) for j in (0, 1)]
            vals = [torch.from_numpy(np.frombuffer(blobs[3 * i + 2], dtype="<f4").astype(np.float32)) for i in range(n)]
            ints = torch.cat(ints).to(self.device) if ints else torch.zeros(0, dtype=torch.int64)
            vals = torch.cat(vals).to(self.device) if vals else torch.zeros(0)
        else:
            ints = torch.empty(2 * sum(counts), dtype=torch.int64, device=self.device)
            vals = torch.empty(sum(counts), dtype=torch.float32, device=self.device)
        if self.g is not None:
            self.g.broadcast(ints, 0)
            self.g.broadcast(vals, 0)
        out, o, v = [], 0, 0
        for c in counts:
            out.append((ints[o:o + c], ints[o + c:o + 2 * c], vals[v:v + c]))
            o, v = o + 2 * c, v + c
        return out

    def own_combined(self, comb):
        """A sharded rank's entries of a round's aggregate: those in its
        tiles, renumbered from its first."""
        out = []
        for i, (tiles, index, vals) in enumerate(comb):
            lo, hi = self.tile_cuts[i][self.rank], self.tile_cuts[i][self.rank + 1]
            e0, e1 = torch.searchsorted(tiles, torch.tensor([lo, hi], dtype=torch.int64, device=tiles.device)).tolist()
            out.append((tiles[e0:e1] - lo, index[e0:e1], vals[e0:e1]))
        return out

    def apply_combined(self, comb, lr):
        if self.mode != SHARD:
            # Detached views: DeMo writes the weights in place.
            self.demo.apply([p.detach() for p in self.model.tensors], comb, lr)
            return
        # Each tensor whole in turn: this rank updates its share, the
        # shares are gathered, and each rank keeps its FSDP rows.
        self.demo.check_values(comb)
        for i, own in enumerate(self.own_combined(comb)):
            full = self.sharded.full(i)
            self.demo.apply_one(i, self.share(full, i), own, lr)
            self.gather_shares([full], i)
            self.sharded.load(i, full)

    def apply(self, h, blobs):
        self.need_model()
        self.apply_combined(self.combined(h, blobs), float(h["lr"]))
        return {}, []

    def try_(self, h, blobs):
        self.need_model()
        comb = self.combined(h, blobs)
        with torch.no_grad():
            own = [p.detach() for p in self.model.tensors] if self.sharded is None else self.sharded.locals()
            if self.saved is None:
                self.saved = [t.clone() for t in own]
            else:
                for s, t in zip(self.saved, own):
                    s.copy_(t)
        self.trying = True
        self.apply_combined(comb, float(h["lr"]))
        return {}, []

    def undo(self, h, blobs):
        self.need_model()
        if not self.trying:
            raise Refused(Kind.INPUT, "undo without a try")
        with torch.no_grad():
            own = self.model.tensors if self.sharded is None else self.sharded.locals()
            for s, p in zip(self.saved, own):
                p.copy_(s)
        self.trying = False
        return {}, []

    def params(self, h, blobs):
        self.need_model()
        return {}, [f32_bytes(p) for p in self.whole_tensors()]

    def whole_tensors(self):
        """The model's tensors (a sharded rank's gathered one at a time, with
        every rank)."""
        if self.sharded is None:
            yield from self.model.tensors
            return
        for i in range(len(self.model.tensors)):
            yield self.sharded.full(i)

    def grads(self, h, blobs):
        self.need_model()
        if not self.has_grad:
            raise Refused(Kind.INPUT, "no gradient")
        if self.mode != SHARD:
            return {}, [f32_bytes(p.grad if p.grad is not None else torch.zeros_like(p)) for p in self.model.tensors]
        full = [torch.zeros(s, dtype=torch.float32, device=self.device) for s in self.shapes]
        for i, (f, g) in enumerate(zip(full, self.own_grads)):
            self.share(f, i).copy_(g)
        self.gather_shares(full)
        return {}, [f32_bytes(f) for f in full]

    def digests(self, h, blobs):
        """Every rank's digest of its parameters (tests: the ranks must
        hold the same weights, bit for bit; sharded ranks hash the tensors
        gathered from their shards)."""
        self.need_model()
        import hashlib
        d = hashlib.sha256()
        for p in self.whole_tensors():
            d.update(f32_bytes(p))
        mine = torch.tensor(list(d.digest()), dtype=torch.uint8)
        if self.g is None:
            return {"digests": [d.hexdigest()]}, []
        out = [torch.zeros_like(mine) for _ in range(self.g.world)]
        self.g.all_gather(out, mine)
        return {"digests": [bytes(o.tolist()).hex() for o in out]}, []

    def stats(self, h, blobs):
        """Device memory: allocated now and at its peak since the last stats."""
        out = {"memory": self.memory(), "peak": 0}
        if self.device.type == "cuda":
            out["peak"] = int(torch.cuda.max_memory_allocated(self.device))
            if h.get("reset"):
                torch.cuda.reset_peak_memory_stats(self.device)
        return out, []

    def set_grads(self, h, blobs):
        """Replaces the kept gradient (tests feed both engines one gradient)."""
        self.need_model()
        lens = h.get("blobs", [])
        if len(lens) != len(self.model.tensors):
            raise Refused(Kind.INPUT, "%d gradients for %d tensors" % (len(lens), len(self.model.tensors)))
        for p, n in zip(self.model.tensors, lens):
            if n != 4 * p.numel():
                raise Refused(Kind.INPUT, "a gradient of %d bytes for a tensor of %d values" % (n, p.numel()))
        self.own_grads = []
        for i, p in enumerate(self.model.tensors):
            if blobs is not None:
                g = torch.from_numpy(np.frombuffer(blobs[i], dtype="<f4").astype(np.float32)).view(p.shape).to(self.device)
            else:
                g = torch.empty(self.shapes[i], dtype=torch.float32, device=self.device)
            if self.mode == SHARD:
                self.g.broadcast(g, 0)
                self.own_grads.append(self.share(g, i).clone())
            else:
                p.grad = g
        self.has_grad = True
        return {}, []

    def ops(self):
        return {"hello": self.hello, "describe": self.describe, "open": self.open, "gradient": self.gradient, "losses": self.losses,
                "step": self.step, "apply": self.apply, "try": self.try_, "undo": self.undo, "params": self.params,
                "grads": self.grads, "set_grads": self.set_grads, "stats": self.stats, "digests": self.digests}


def split_rows(n: int, world: int, r: int):
    """Rank r's contiguous share [a, b) of a batch's n sequences."""
    return n * r // world, n * (r + 1) // world


def dist_min():
    import torch.distributed as dist
    return dist.ReduceOp.MIN


def rank_main(argv) -> int:
    """A rank > 0 of a multi-device worker: rank 0 started it (ranks.py)."""
    args = dict(zip(argv[0::2], argv[1::2]))
    import ranks  # noqa: E402
    ranks.die_with_parent(int(args["--parent"]))
    rank = int(args["--rank"])
    devices = args["--devices"].split(",")
    w = Worker()
    w.device = torch.device(devices[rank])
    if w.device.type == "cuda":
        torch.cuda.set_device(w.device)
    cpu_threads(len(devices))
    w.g = ranks.Group(rank, devices, args["--backend"], float(args["--timeout"]),
                      os.path.dirname(os.path.abspath(__file__)))
    w.g.join(int(args["--cmd-fd"]))
    ops = w.ops()
    while True:
        h = w.g.recv()
        if h is None:
            return 0
        try:
            ops[h["op"]](h, None)
        except Refused:
            pass  # every rank refuses alike; rank 0 answers
        except Exception as exc:
            traceback.print_exc()
            say("%s: %s: %s" % (w.g.name(rank), type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc) else ""))
            return 1


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        return rank_main(sys.argv[1:])
    try:
        rd = os.fdopen(protocol.REQUEST_FD, "rb", buffering=1 << 20)
        wr = os.fdopen(protocol.ANSWER_FD, "wb", buffering=1 << 20)
    except OSError as exc:
        say("fds 3 and 4 are psyche's pipes; run this file through psyche (%s)" % exc)
        return 2
    w = Worker()
    ops = w.ops()
    while True:
        try:
            h, blobs = read_message(rd)
        except EOFError:
            h = None
        if h is None:
            if w.g is not None:
                w.g.close()
            return 0
        op = h.get("op")
        try:
            if op == "hello" and h.get("protocol") != protocol.VERSION:
                raise Refused(Kind.INPUT, "protocol %s, this worker speaks %d" % (h.get("protocol"), protocol.VERSION))
            fn = ops.get(op)
            if fn is None:
                raise Refused(Kind.INPUT, "unknown op %r" % op)
            if w.forwarded(op):
                w.g.send(h)
            ans, out = fn(h, blobs)
            ans = dict(ans)
            ans["ok"] = True
        except Refused as exc:
            ans, out = protocol.failure(exc.kind, str(exc)), []
        except Exception as exc:  # the worker lives on; psyche decides
            if w.g is not None:
                # The ranks' collectives are out of step: the worker ends,
                # saying which rank failed and how.
                traceback.print_exc()
                w.g.failed(exc)
            if is_oom(exc):
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                ans, out = protocol.failure(Kind.OOM, str(exc).strip()), []
            else:
                traceback.print_exc()
                ans, out = protocol.failure(Kind.INTERNAL, "%s: %s" % (type(exc).__name__, exc)), []
        write_message(wr, ans, out)


if __name__ == "__main__":
    sys.exit(main())
