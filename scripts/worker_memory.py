#!/usr/bin/env python3
"""The PyTorch worker's resident memory, request by request, on the CPU (scripts/worker-memory runs it).

Starts the real worker (trainer/engine/torch/worker/worker.py, or --worker
DIR's) on its two pipes, as psyche does, and sends it what a trainer's
worker gets: hello, open (the weights as blobs, one tensor after another),
rounds of gradient (forward and backward of a batch), step (DisTrO's
compression into the trainer's frame) and apply (the frame as the round's
aggregate), then what a witness, a checkpoint and an evaluation ask: try,
undo, read (every tensor whole), losses. Before each request the worker's
peak resident size is reset (5 written to /proc/PID/clear_refs resets
VmHWM); after its answer the peak (VmHWM) and the size now (VmRSS) are read
from /proc/PID/status. One line per request, then one JSON line with every
figure and digests of what the worker computed (the losses, each frame, the
parameters at the end: sha256 of their bytes), so that two runs on two
versions of the worker show whether they computed the same bits.

    python3 scripts/worker_memory.py [--worker DIR] [--label NAME] [--rounds 2] [--shape qwen2.5-0.5b]

The default shape is Qwen2.5-0.5B's (vocab 151936, width 896, 24 layers, 14
heads, 2 key/value heads, MLP 4864, the head tied to the embeddings) at a
context of 128, one sequence of 128 tokens a step, fp32, DisTrO as
scripts/big-run trains it (chunk 64, top-k 12, decay 0.97, 1-bit, clip 1,
and a run's default normalization, RMS: DisTrO keeps a running mean square
of every coefficient beside the momentum, another 4 bytes a parameter).
The weights are drawn here (normal, 0.02; the norms 1) and sent once.
"""

import argparse
import fcntl
import hashlib
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "trainer", "engine", "torch", "worker")
sys.path.insert(0, WORKER)
import protocol  # noqa: E402  the framing psyche and the worker speak, from this tree

SHAPES = {
    "qwen2.5-0.5b": dict(vocab=151936, context=128, width=896, layers=24, heads=14, kv_heads=2,
                         intermediate=4864, rope_theta=1e6, norm_eps=1e-6, tied_head=True),
    # A small one, to try the script.
    "tiny": dict(vocab=4096, context=128, width=128, layers=2, heads=4, kv_heads=2,
                 intermediate=256, rope_theta=1e4, norm_eps=1e-5, tied_head=True),
}


def llama_specs(c):
    """trainer/llama's tensors (name, shape), in order (models.Llama's)."""
    C, L, I, V = c["width"], c["layers"], c["intermediate"], c["vocab"]
    W = (c["heads"] + 2 * c["kv_heads"]) * (C // c["heads"])
    specs = [("embed", [V, C]), ("attn_norm.weight", [L, C]), ("attn.qkv.weight", [L, W, C]),
             ("attn.o.weight", [L, C, C]), ("mlp_norm.weight", [L, C]), ("mlp.gate_up.weight", [L, 2 * I, C]),
             ("mlp.down.weight", [L, C, I]), ("norm.weight", [C])]
    if not c["tied_head"]:
        specs.append(("head.weight", [V, C]))
    return specs


def largest_divisor(n, chunk):
    """distro.LargestDivisor."""
    for d in range(min(n, chunk), 1, -1):
        if n % d == 0:
            return d
    return 1


def layout(shape, chunk, topk):
    """distro's TileLayout of a tensor of shape (newTensorPlan)."""
    outer = math.prod(shape[:-2]) if len(shape) > 2 else 1
    cols = shape[-1]
    rows = shape[-2] if len(shape) >= 2 else 1
    th, tw = largest_divisor(rows, chunk), largest_divisor(cols, chunk)
    return {"shape": list(shape), "outer": outer, "rows": rows, "cols": cols, "th": th, "tw": tw,
            "k": min(topk, th * tw)}


class Worker:
    """The worker process on its pipes (requests on its fd 3, answers on its fd 4)."""

    def __init__(self, python, script):
        req_r, self.req_w = os.pipe()
        self.ans_r, ans_w = os.pipe()

        def pipes():
            # Above 4 first, so that neither dup2 closes the other's source.
            a = fcntl.fcntl(req_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(ans_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)
        self.p = subprocess.Popen([python, script], preexec_fn=pipes, close_fds=False)
        os.close(req_r)
        os.close(ans_w)
        self.wr = os.fdopen(self.req_w, "wb", buffering=1 << 20)
        self.rd = os.fdopen(self.ans_r, "rb", buffering=1 << 20)

    def status(self):
        """(VmHWM, VmRSS) in bytes."""
        out = {}
        with open("/proc/%d/status" % self.p.pid) as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmHWM", "VmRSS"):
                    out[k] = int(v.split()[0]) * 1024
        return out["VmHWM"], out["VmRSS"]

    def reset_peak(self):
        with open("/proc/%d/clear_refs" % self.p.pid, "w") as f:
            f.write("5")

    def send(self, h, blobs=()):
        """A request, framed as psyche frames it (the worker's protocol.py)."""
        protocol.write_message(self.wr, h, blobs)

    def answer(self):
        h, blobs = protocol.read_message(self.rd)
        if h is None:
            raise EOFError("the worker closed its answers")
        if not h.get("ok"):
            raise RuntimeError("worker: %s: %s" % (h.get("kind"), h.get("error")))
        return h, blobs

    def close(self):
        self.wr.close()
        self.p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", default=WORKER, help="the worker's directory (worker.py and the rest)")
    ap.add_argument("--python", default=sys.executable, help="the python that runs the worker")
    ap.add_argument("--label", default="", help="a name for this run in the output")
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--topk", type=int, default=12)
    a = ap.parse_args()

    cfg = SHAPES[a.shape]
    specs = llama_specs(cfg)
    shapes = [s for _, s in specs]
    layouts = [layout(s, a.chunk, a.topk) for s in shapes]
    params = sum(math.prod(s) for s in shapes)
    gib = float(1 << 30)
    figures, digests = [], {"frames": []}

    w = Worker(a.python, os.path.join(os.path.abspath(a.worker), "worker.py"))

    def phase(name, h, blobs=()):
        w.reset_peak()
        _, before = w.status()
        t0 = time.monotonic()
        w.send(h, blobs)
        ans = w.answer()
        secs = time.monotonic() - t0
        peak, rss = w.status()
        figures.append({"phase": name, "peak": peak, "rss": rss, "before": before, "s": round(secs, 2)})
        print("%-9s peak %6.2f GiB  after %6.2f GiB  (peak %+.2f GiB over the start)  %6.1f s"
              % (name, peak / gib, rss / gib, (peak - before) / gib, secs), flush=True)
        return ans

    try:
        hello = phase("hello", {"op": "hello", "protocol": json.load(open(os.path.join(a.worker, "protocol.json")))["version"],
                                "device": "cpu"})[0]
        print("torch %s, python %s" % (hello["torch"], hello["python"]), flush=True)

        rng = np.random.default_rng(1)

        def weights():
            # Drawn in float32 a tensor at a time (this process holds the
            # model's bytes once, as psyche's open request does not: what
            # is measured is the worker).
            for name, s in specs:
                if "norm" in name:
                    yield np.ones(math.prod(s), dtype="<f4").tobytes()
                else:
                    yield (rng.standard_normal(math.prod(s), dtype=np.float32) * np.float32(0.02)).astype("<f4").tobytes()
        opened = {"op": "open", "arch": "llama", "config": cfg, "seed": None, "layouts": layouts, "shapes": shapes,
                  "distro": {"decay": 0.97, "weight_decay": 0.0, "clip": 1.0, "quantize": True,
                             "normalize_rms": True, "max_value": float(2 ** 40)},
                  "precision": "fp32", "compile": False}
        phase("open", opened, list(weights()))

        batches = np.random.default_rng(7)
        losses = []
        for r in range(a.rounds + 1):
            x = batches.integers(0, cfg["vocab"], size=a.seq, dtype=np.uint32).astype("<u4").tobytes()
            y = batches.integers(0, cfg["vocab"], size=a.seq, dtype=np.uint32).astype("<u4").tobytes()
            if r == a.rounds:  # an evaluation's forward after the rounds
                ans, _ = phase("losses", {"op": "losses", "b": 1, "t": a.seq}, [x, y])
                losses.append(ans["loss"])
                break
            ans, _ = phase("gradient", {"op": "gradient", "b": 1, "t": a.seq}, [x, y])
            losses.append(ans["loss"])
            _, frame = phase("step", {"op": "step", "lr": 1e-3})
            digests["frames"].append(hashlib.sha256(b"".join(frame)).hexdigest())
            # The trainer's frame as the round's aggregate: per tensor, the
            # tiles (each k times, ascending), the indices and the values.
            comb = []
            for i, l in enumerate(layouts):
                tiles = l["outer"] * (l["rows"] // l["th"]) * (l["cols"] // l["tw"])
                comb += [np.repeat(np.arange(tiles, dtype="<u4"), l["k"]).tobytes(), frame[2 * i], frame[2 * i + 1]]
            phase("apply", {"op": "apply", "lr": 1e-3}, comb)
            if r == a.rounds - 1:  # a witness's try of the same aggregate, and its undo
                phase("try", {"op": "try", "lr": 1e-3}, comb)
                phase("undo", {"op": "undo"})
        # A checkpoint's read of every tensor, whole.
        for i, s in enumerate(shapes):
            phase("read %d" % i, {"op": "read", "tensor": i, "offset": 0, "count": math.prod(s)})
        w.send({"op": "digests"})
        digests["params"] = w.answer()[0]["digests"][0]
    finally:
        w.close()

    most = max(figures, key=lambda f: f["peak"])
    print("largest peak %.2f GiB (%s); parameters %d (%.2f GiB each of weights, gradient, momentum, mean squares); losses %s"
          % (most["peak"] / gib, most["phase"], params, 4 * params / gib, " ".join("%.6f" % x for x in losses)), flush=True)
    digests["losses"] = losses
    print(json.dumps({"label": a.label, "shape": a.shape, "params": params, "peak": most["peak"],
                      "phases": figures, "digests": digests}), flush=True)


if __name__ == "__main__":
    main()
