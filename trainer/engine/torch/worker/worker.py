"""psyche's PyTorch worker: the engine's half that runs next to torch.

psyche starts this file (embedded in its binary) and drives it over two
pipes: requests arrive on fd 3, answers leave on fd 4, each a message of

    u32 little-endian header length | JSON header | blobs back to back

where the header's "blobs" lists each blob's byte length (the Go side of the
format is trainer/engine/torch/wire.go). The worker holds one model
(models.py), its gradient and its DisTrO state (distro.py) on one torch
device and answers one request at a time. It exits when fd 3 closes.
stdout and stderr are free for torch's own output; lines starting with
"psyche-worker: " are what psyche logs at info level.
"""

import json
import os
import struct
import sys
import traceback

PROTOCOL = 1
EXIT_MISSING = 3  # torch or numpy cannot be imported: psyche tries another python

try:
    import numpy as np
    import torch
except ImportError as exc:  # the one failure psyche explains to the user itself
    sys.stderr.write("psyche-worker: missing python module %s\n" % (exc.name or exc))
    sys.exit(EXIT_MISSING)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import distro  # noqa: E402  (beside this file)
import models  # noqa: E402


def say(msg: str) -> None:
    sys.stderr.write("psyche-worker: " + msg + "\n")
    sys.stderr.flush()


class Refused(Exception):
    """A request the worker answers with an error and survives."""

    def __init__(self, kind: str, msg: str):
        super().__init__(msg)
        self.kind = kind


def read_exact(f, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def read_message(f):
    head = f.read(4)
    if not head:
        return None, None  # psyche closed the pipe: exit
    if len(head) < 4:
        head += read_exact(f, 4 - len(head))
    (n,) = struct.unpack("<I", head)
    h = json.loads(read_exact(f, n))
    blobs = [read_exact(f, int(k)) for k in h.get("blobs", [])]
    return h, blobs


def write_message(f, h: dict, blobs=()) -> None:
    blobs = [b if isinstance(b, (bytes, bytearray, memoryview)) else bytes(b) for b in blobs]
    h = dict(h)
    h["blobs"] = [len(b) for b in blobs]
    js = json.dumps(h).encode()
    f.write(struct.pack("<I", len(js)))
    f.write(js)
    for b in blobs:
        f.write(b)
    f.flush()


def f32_bytes(t: "torch.Tensor") -> bytes:
    return t.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False).tobytes()


def u32_bytes(t: "torch.Tensor") -> bytes:
    # int32 and uint32 share their bytes for indices below 2^31 (a tile
    # has at most 2^31 coefficients).
    return t.detach().to("cpu", torch.int32).contiguous().numpy().astype("<i4", copy=False).tobytes()


def is_oom(exc: BaseException) -> bool:
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    msg = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg)


class Worker:
    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.model = None
        self.demo = None
        self.amp = None
        self.shapes = []
        self.saved = None  # parameters saved by try
        self.has_grad = False
        self.step_fn = None
        self.loss_fn = None

    # -- requests --------------------------------------------------------

    def hello(self, h, blobs):
        dev = h.get("device", "cpu")
        self.device = torch.device(dev)
        name, memory, bf16 = "", 0, True
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise Refused("input", "device %s: this torch (%s) sees no CUDA device" % (dev, torch.__version__))
            idx = self.device.index if self.device.index is not None else torch.cuda.current_device()
            if idx >= torch.cuda.device_count():
                raise Refused("input", "device %s: this machine has %d CUDA devices" % (dev, torch.cuda.device_count()))
            self.device = torch.device("cuda", idx)
            torch.cuda.set_device(self.device)
            props = torch.cuda.get_device_properties(idx)
            name, memory = props.name, int(props.total_memory)
            bf16 = bool(getattr(torch.cuda, "is_bf16_supported", lambda: True)())
        elif self.device.type == "mps":
            mps = getattr(torch.backends, "mps", None)
            if mps is None or not mps.is_available():
                raise Refused("input", "device mps: this torch (%s) has no usable mps backend" % torch.__version__)
        return {
            "protocol": PROTOCOL,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "python": sys.version.split()[0],
            "device": str(self.device),
            "device_name": name,
            "memory": memory,
            "sdpa": hasattr(torch.nn.functional, "scaled_dot_product_attention"),
            "compile": hasattr(torch, "compile"),
            "bf16": bf16,
        }, []

    def open(self, h, blobs):
        self.model = models.build(h["arch"], h["config"], self.device)
        tensors = self.model.tensors
        self.shapes = [list(s) for s in h["shapes"]]
        if len(tensors) != len(self.shapes) or len(blobs) != len(tensors):
            raise Refused("input", "the model has %d tensors; psyche sent %d shapes and %d tensors"
                          % (len(tensors), len(self.shapes), len(blobs)))
        with torch.no_grad():
            for i, (p, b) in enumerate(zip(tensors, blobs)):
                if list(p.shape) != self.shapes[i]:
                    raise Refused("input", "tensor %d has shape %s here, %s in psyche" % (i, list(p.shape), self.shapes[i]))
                src = torch.from_numpy(np.frombuffer(b, dtype="<f4").astype(np.float32)).view(p.shape)
                p.copy_(src)
        self.demo = distro.DeMo(h["layouts"], h["distro"], self.device)
        self.amp = torch.bfloat16 if h.get("precision") == "bf16" else None
        self.saved = None
        self.has_grad = False
        self.loss_fn = self.model.forward_losses
        compiled = False
        if h.get("compile"):
            if hasattr(torch, "compile"):
                self.loss_fn = torch.compile(self.model.forward_losses)
                compiled = True
            else:
                say("torch %s has no torch.compile: running eagerly" % torch.__version__)
        params = sum(p.numel() for p in tensors)
        mem = self.memory()
        say("model of %d parameters on %s (%s%s)%s" % (
            params, self.device, "bf16 autocast" if self.amp is not None else "fp32",
            ", compiled" if compiled else "", ", %.2f GiB allocated" % (mem / 2**30) if mem else ""))
        return {"params": params, "memory": mem}, []

    def memory(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.memory_allocated(self.device))
        return 0

    def batch(self, h, blobs):
        b, t = int(h["b"]), int(h["t"])
        if len(blobs) != 2 or len(blobs[0]) != 4 * b * t or len(blobs[1]) != 4 * b * t:
            raise Refused("input", "a %d×%d batch needs two blobs of %d bytes" % (b, t, 4 * b * t))
        x = torch.from_numpy(np.frombuffer(blobs[0], dtype="<u4").astype(np.int64)).view(b, t).to(self.device)
        y = torch.from_numpy(np.frombuffer(blobs[1], dtype="<u4").astype(np.int64)).view(b, t).to(self.device)
        return x, y

    def need_model(self):
        if self.model is None:
            raise Refused("input", "no model is open")

    def gradient(self, h, blobs):
        self.need_model()
        x, y = self.batch(h, blobs)
        for p in self.model.tensors:
            p.grad = None
        self.has_grad = False
        loss, seq = self.loss_fn(x, y, self.amp)
        loss.backward()
        self.has_grad = True
        return {"loss": float(loss.detach().float().item())}, [f32_bytes(seq)]

    def losses(self, h, blobs):
        self.need_model()
        x, y = self.batch(h, blobs)
        with torch.no_grad():
            loss, seq = self.loss_fn(x, y, self.amp)
        return {"loss": float(loss.detach().float().item())}, [f32_bytes(seq)]

    def step(self, h, blobs):
        self.need_model()
        if not self.has_grad:
            raise Refused("input", "step without a gradient")
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.model.tensors]
        try:
            out = self.demo.step(grads, float(h["lr"]))
        except distro.NonFinite as exc:
            raise Refused("nonfinite", str(exc) or "the gradient is not finite")
        blobs = []
        for idx, vals in out:
            blobs += [u32_bytes(idx), f32_bytes(vals)]
        return {}, blobs

    def combined(self, blobs):
        n = len(self.model.tensors)
        if len(blobs) != 3 * n:
            raise Refused("input", "an aggregate of %d blobs for %d tensors" % (len(blobs), n))
        out = []
        for i in range(n):
            tiles = torch.from_numpy(np.frombuffer(blobs[3 * i], dtype="<u4").astype(np.int64)).to(self.device)
            index = torch.from_numpy(np.frombuffer(blobs[3 * i + 1], dtype="<u4").astype(np.int64)).to(self.device)
            vals = torch.from_numpy(np.frombuffer(blobs[3 * i + 2], dtype="<f4").astype(np.float32)).to(self.device)
            out.append((tiles, index, vals))
        return out

    def apply(self, h, blobs):
        self.need_model()
        self.demo.apply([p.data for p in self.model.tensors], self.combined(blobs), float(h["lr"]))
        return {}, []

    def try_(self, h, blobs):
        self.need_model()
        comb = self.combined(blobs)
        with torch.no_grad():
            if self.saved is None:
                self.saved = [p.detach().clone() for p in self.model.tensors]
            else:
                for s, p in zip(self.saved, self.model.tensors):
                    s.copy_(p.detach())
        self.trying = True
        self.demo.apply([p.data for p in self.model.tensors], comb, float(h["lr"]))
        return {}, []

    def undo(self, h, blobs):
        self.need_model()
        if not getattr(self, "trying", False):
            raise Refused("input", "undo without a try")
        with torch.no_grad():
            for s, p in zip(self.saved, self.model.tensors):
                p.copy_(s)
        self.trying = False
        return {}, []

    def params(self, h, blobs):
        self.need_model()
        return {}, [f32_bytes(p) for p in self.model.tensors]

    def grads(self, h, blobs):
        self.need_model()
        if not self.has_grad:
            raise Refused("input", "no gradient")
        return {}, [f32_bytes(p.grad if p.grad is not None else torch.zeros_like(p)) for p in self.model.tensors]


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
        if len(blobs) != len(self.model.tensors):
            raise Refused("input", "%d gradients for %d tensors" % (len(blobs), len(self.model.tensors)))
        for p, b in zip(self.model.tensors, blobs):
            if len(b) != 4 * p.numel():
                raise Refused("input", "a gradient of %d bytes for a tensor of %d values" % (len(b), p.numel()))
            p.grad = torch.from_numpy(np.frombuffer(b, dtype="<f4").astype(np.float32)).view(p.shape).to(self.device)
        self.has_grad = True
        return {}, []


def main() -> int:
    try:
        rd = os.fdopen(3, "rb", buffering=1 << 20)
        wr = os.fdopen(4, "wb", buffering=1 << 20)
    except OSError as exc:
        say("fds 3 and 4 are psyche's pipes; run this file through psyche (%s)" % exc)
        return 2
    w = Worker()
    ops = {"hello": w.hello, "open": w.open, "gradient": w.gradient, "losses": w.losses, "step": w.step,
           "apply": w.apply, "try": w.try_, "undo": w.undo, "params": w.params, "grads": w.grads,
           "set_grads": w.set_grads, "stats": w.stats}
    while True:
        try:
            h, blobs = read_message(rd)
        except EOFError:
            return 0
        if h is None:
            return 0
        op = h.get("op")
        try:
            if op == "hello" and h.get("protocol") != PROTOCOL:
                raise Refused("input", "protocol %s, this worker speaks %d" % (h.get("protocol"), PROTOCOL))
            fn = ops.get(op)
            if fn is None:
                raise Refused("input", "unknown op %r" % op)
            ans, out = fn(h, blobs)
            ans = dict(ans)
            ans["ok"] = True
        except Refused as exc:
            ans, out = {"ok": False, "kind": exc.kind, "error": str(exc)}, []
        except Exception as exc:  # the worker lives on; psyche decides
            if is_oom(exc):
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                ans, out = {"ok": False, "kind": "oom", "error": str(exc).strip()}, []
            else:
                traceback.print_exc()
                ans, out = {"ok": False, "kind": "internal", "error": "%s: %s" % (type(exc).__name__, exc)}, []
        write_message(wr, ans, out)


if __name__ == "__main__":
    sys.exit(main())
