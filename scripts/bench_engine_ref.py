#!/usr/bin/env python3
"""Plain PyTorch reference for scripts/bench-engine: the torch engine's round in one process.

A trainer's round through the torch engine is three requests to its worker
(trainer/engine/torch/worker): the gradient of a batch, the DisTrO step that
compresses it into the trainer's frame, and the apply of the round's frames
(combined in Go by distro.Plan.Combine). This script does the same work with
the same worker modules imported directly (models.build, distro.DeMo), in one
Python process, with nothing crossing a pipe, and prints one JSON line:

    python3 scripts/bench_engine_ref.py --spec SPEC.json [--weights W.bin] --batch 8 --rounds 5

    {"impl": "plain-torch", "tokens_per_s": ..., "round_ms": ..., "gradient_ms": ...,
     "step_ms": ..., "apply_ms": ..., "losses": [...], "threads": 2, ...}

SPEC.json and W.bin are what scripts/benchengine writes (-spec-out,
-weights-out): the model's shape, the DisTrO plan's tile layouts and options,
the learning rate and the number of frames a round applies, and the initial
weights. The batches and the other peers' frames are made exactly as
benchengine makes them (the same integer hash), and the round's aggregate is
computed here, on the device, as Go's Combine computes it for the run's rule
(robust: with 1-bit values the per-index sign vote clamped to ±q, q = min(peers,
3), over q; mean: the per-index average). So with the same weights every
round's loss should equal the torch engine's: the difference in time is what
the process seam costs (the pipe, the frame and aggregate crossing it, Go's
Combine), not other arithmetic.

A transformers model (spec arch "transformers": a config.json's text and the
run's seed) is the plain transformers loop: the network built with
AutoModelForCausalLM.from_config from that text (SDPA attention, float32,
dropout off, drawn from the seed under a private RNG state on the CPU, as the
worker draws it, so the weights and the losses are the worker's), its logits
from a plain forward, the per-token cross-entropy's mean, backward; then the
worker's DisTrO step and apply as above. Nothing is fetched from a hub.

What a round is here, as the worker does it:
  * gradient: every parameter's .grad set to None, model.forward_losses (under
    bf16 autocast with --precision bf16, torch.compile'd with --compile), the
    loss's backward, and loss.item() (the worker answers with the loss);
  * step: distro.DeMo.step on the gradients (the frame's indices and values
    stay on the device: nothing sends them anywhere);
  * apply: the trainer's frame and the peers' combined, then DeMo.apply.
--threads sets torch.set_num_threads (the engine's worker gets the same count
through OMP_NUM_THREADS, which benchengine -threads sets).
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The worker's modules: beside this file in scripts/gpu-bundle's .gpu/worker,
# else in the repository.
WORKER = os.path.join(HERE, "worker")
if not os.path.isfile(os.path.join(WORKER, "distro.py")):
    WORKER = os.path.join(HERE, "..", "trainer", "engine", "torch", "worker")

M32 = 0xFFFFFFFF


def mix(x):
    """benchengine's mix (lowbias32) on a numpy uint64 array of values < 2^32."""
    import numpy as np

    x = np.asarray(x, dtype=np.uint64) & np.uint64(M32)
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x7FEB352D)) & np.uint64(M32)
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x846CA68B)) & np.uint64(M32)
    x ^= x >> np.uint64(16)
    return x


def make_batch(rnd, b, t, vocab):
    """benchengine's makeBatch: inputs and targets, int64 [b, t]."""
    import numpy as np

    key = mix((rnd + 0x9E3779B9) & M32)
    j = np.arange(b, dtype=np.uint64)[:, None]
    p = np.arange(t, dtype=np.uint64)[None, :]
    i = j * np.uint64(t + 1) + p
    x = mix(i ^ key) % np.uint64(vocab)
    y = mix((i + np.uint64(1)) ^ key) % np.uint64(vocab)
    return x.astype(np.int64), y.astype(np.int64)


def peer_frame(p, layouts):
    """benchengine's peerFrames for peer p: per tensor, indices (int64 [tiles,
    k], ascending in each tile) and values (float32, ±1)."""
    import numpy as np

    out = []
    for i, l in enumerate(layouts):
        ts, k = int(l["th"]) * int(l["tw"]), int(l["k"])
        tiles = int(l["outer"]) * (int(l["rows"]) // int(l["th"])) * (int(l["cols"]) // int(l["tw"]))
        step = ts // k
        t = np.arange(tiles, dtype=np.uint64)
        h = mix(mix(mix(p) ^ np.uint64(i)) ^ t)[:, None]
        j = np.arange(k, dtype=np.uint64)[None, :]
        idx = ((h % np.uint64(ts)) + j * np.uint64(step)) % np.uint64(ts)
        bits = mix(h ^ (((j + np.uint64(1)) * np.uint64(0x9E3779B9)) & np.uint64(M32))) & np.uint64(1)
        vals = np.where(bits == 1, 1.0, -1.0).astype(np.float32)
        order = np.argsort(idx, axis=1, kind="stable")
        out.append((np.take_along_axis(idx, order, 1).astype(np.int64), np.take_along_axis(vals, order, 1)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True, help="benchengine -spec-out's file")
    ap.add_argument("--weights", default="", help="benchengine -weights-out's file (default: random normal weights)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=0, help="tokens per sequence (default: the spec's)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--compile", action="store_true", help="torch.compile the forward, as the engine's --compile")
    ap.add_argument("--lockstep", action="store_true",
                    help="take rounds from stdin ('round R B' lines, then 'end'): benchengine -engines plain-torch")
    ap.add_argument("--worker", default=WORKER, help="the directory of the worker's models.py and distro.py")
    a = ap.parse_args()

    spec = json.load(open(a.spec))
    seq = a.seq or int(spec["seq"])
    rec = dict(impl="plain-torch", shape=spec.get("shape"), arch=spec["arch"], params=spec.get("params"), batch=a.batch,
               seq=seq, rounds=a.rounds, peers=int(spec["peers"]), precision=a.precision, device=a.device,
               mode="compile" if a.compile else "eager")

    def emit(r):
        sys.stdout.flush()
        print(json.dumps(r), flush=True)

    try:
        import numpy as np
        import torch
    except ImportError as e:
        rec["error"] = "import: %s" % e
        emit(rec)
        return 1
    sys.path.insert(0, os.path.abspath(a.worker))
    import distro  # noqa: E402  (the worker's)
    import models  # noqa: E402

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    rec.update(torch=torch.__version__, threads=torch.get_num_threads(),
               name="plain torch %s on %s, %s%s" % (torch.__version__, a.device, a.precision, ", compiled" if a.compile else ""))
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        rec["error"] = "CUDA is not available to torch"
        emit(rec)
        return 1
    agg = spec["aggregation"]
    quantize = bool(spec["distro"]["quantize"])
    if agg not in ("robust", "mean") or (agg == "robust" and not quantize):
        rec["error"] = "aggregation %s%s: this reference combines robust 1-bit runs and mean runs only" % (
            agg, "" if quantize else " without 1-bit values")
        emit(rec)
        return 2

    try:
        torch.manual_seed(1)
        if spec["arch"] == "transformers":
            net = build_transformers(torch, spec["config"]["json"], int(spec["config"]["seed"]), device)
            tensors = [p for _, p in net.named_parameters()]
            loss_fn = transformers_loss(torch, net)
        else:
            model = models.build(spec["arch"], spec["config"], device)
            tensors = model.tensors
            loss_fn = model.forward_losses
        if a.compile:
            loss_fn = torch.compile(loss_fn)
        with torch.no_grad():
            if a.weights:
                w = np.fromfile(a.weights, dtype="<f4")
                at = 0
                for p in tensors:
                    n = p.numel()
                    p.copy_(torch.from_numpy(w[at:at + n].astype(np.float32)).view(p.shape))
                    at += n
                if at != w.size:
                    raise ValueError("%s holds %d values, the model %d" % (a.weights, w.size, at))
            elif spec["arch"] != "transformers":  # transformers drew its own from the seed
                for p in tensors:
                    p.normal_(0, 0.02)
        layouts = spec["layouts"]
        demo = distro.DeMo(layouts, spec["distro"], device)
        amp = torch.bfloat16 if a.precision == "bf16" else None
        lr = float(spec["lr"])
        npeers = int(spec["peers"])
        vocab = int(spec["vocab"])

        # The other peers' frames, on the device, flattened to (key = tile*ts
        # + index, value) per tensor, made before the rounds as a trainer
        # receives them.
        sizes = []
        for l in layouts:
            ts = int(l["th"]) * int(l["tw"])
            tiles = int(l["outer"]) * (int(l["rows"]) // int(l["th"])) * (int(l["cols"]) // int(l["tw"]))
            sizes.append((tiles, ts, int(l["k"])))
        others = []
        for p in range(1, npeers):
            f = []
            for (idx, vals), (tiles, ts, k) in zip(peer_frame(p, layouts), sizes):
                keys = (np.arange(tiles, dtype=np.int64)[:, None] * ts + idx).reshape(-1)
                f.append((torch.from_numpy(keys).to(device), torch.from_numpy(vals.reshape(-1)).to(device)))
            others.append(f)
        q = float(min(npeers, 3))

        def combine(own):
            """Go's Plan.Combine for the run's rule: per tensor the tiles,
            indices and values of the nonzero combined coefficients, sorted
            by tile then index."""
            out = []
            for i, ((idx, vals), (tiles, ts, k)) in enumerate(zip(own, sizes)):
                own_keys = torch.arange(tiles, device=device, dtype=torch.int64).repeat_interleave(k) * ts + idx.to(torch.int64)
                keys = torch.cat([own_keys] + [f[i][0] for f in others])
                v = torch.cat([vals.to(torch.float32)] + [f[i][1] for f in others])
                # Each (tile, index) sent once or more, in order, and which
                # one each entry is: the aggregate's size is the frames'.
                u, inv = torch.unique(keys, sorted=True, return_inverse=True)
                if agg == "robust":  # 1-bit: the sign vote
                    total = torch.zeros(u.numel(), dtype=torch.float32, device=device).index_add_(0, inv, torch.sign(v))
                    c = total.clamp_(-q, q).div_(q)
                else:  # mean: the per-index average
                    total = torch.zeros(u.numel(), dtype=torch.float32, device=device).index_add_(0, inv, v)
                    count = torch.zeros(u.numel(), dtype=torch.float32, device=device).index_add_(0, inv, torch.ones_like(v))
                    c = total.div_(count)
                nz = c != 0
                u, c = u[nz], c[nz]
                out.append((u // ts, u % ts, c))
            return out

        def sync():
            if cuda:
                torch.cuda.synchronize(device)

        def run_round(rnd, b):
            """One round at batch b: its loss and phases in milliseconds."""
            xs, ys = make_batch(rnd, b, seq, vocab)
            t0 = time.perf_counter()
            x = torch.from_numpy(xs).to(device)
            y = torch.from_numpy(ys).to(device)
            for p in tensors:
                p.grad = None
            loss, _ = loss_fn(x, y, amp)
            loss.backward()
            loss = float(loss.detach().float().item())
            t1 = time.perf_counter()
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in tensors]
            own = demo.step(grads, lr)
            sync()
            t2 = time.perf_counter()
            demo.apply([p.detach() for p in tensors], combine(own), lr)
            sync()
            t3 = time.perf_counter()
            return dict(round=rnd, loss=loss, gradient_ms=1e3 * (t1 - t0), step_ms=1e3 * (t2 - t1), apply_ms=1e3 * (t3 - t2))
    except Exception as e:  # noqa: BLE001 - reported as the line's error
        rec["error"] = "%s: %s" % (type(e).__name__, str(e).split("\n")[0])
        emit(rec)
        return 1

    def error_of(e):
        if is_oom(torch, e):
            if cuda:
                torch.cuda.empty_cache()
            return "out of memory: " + str(e).split("\n")[0]
        return "%s: %s" % (type(e).__name__, str(e).split("\n")[0])

    def final():
        if cuda:
            rec["peak_mem_bytes"] = torch.cuda.max_memory_allocated(device)
            rec["device"] = torch.cuda.get_device_name(device)
        try:
            import resource

            rec["host_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        except Exception:  # noqa: BLE001 - not on every platform
            pass

    if a.lockstep:
        # benchengine -engines plain-torch: "round R B" runs round R at batch
        # B and answers its figures; "end" (or the end of stdin) answers the
        # record and exits. Errors are answered, and the process lives on.
        emit(dict(ready=True, name=rec["name"], torch=torch.__version__, threads=rec["threads"]))
        for line in sys.stdin:
            w = line.split()
            if not w:
                continue
            if w[0] == "end":
                break
            try:
                if w[0] != "round" or len(w) != 3:
                    raise ValueError("want 'round R B' or 'end', got %r" % line.strip())
                emit(run_round(int(w[1]), int(w[2])))
            except Exception as e:  # noqa: BLE001 - answered
                emit(dict(error=error_of(e)))
        final()
        emit(rec)
        return 0

    losses, times = [], []
    try:
        t_warm = time.perf_counter()
        for rnd in range(a.warmup + a.rounds):
            r = run_round(rnd, a.batch)
            losses.append(r["loss"])
            if rnd >= a.warmup:
                times.append(r)
            elif rnd == a.warmup - 1:
                rec["warmup_s"] = time.perf_counter() - t_warm
            sys.stderr.write("bench_engine_ref: round %d: loss %.4f, gradient %.0f ms, step %.0f ms, apply %.0f ms%s\n" % (
                rnd, r["loss"], r["gradient_ms"], r["step_ms"], r["apply_ms"], " (warm-up)" if rnd < a.warmup else ""))
    except Exception as e:  # noqa: BLE001 - reported as the line's error
        rec["error"] = error_of(e)
        final()
        emit(rec)
        return 1

    def median(v):
        v = sorted(v)
        n = len(v)
        return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2

    rounds = [t["gradient_ms"] + t["step_ms"] + t["apply_ms"] for t in times]
    rec.update(round_ms=median(rounds), mean_round_ms=sum(rounds) / len(rounds),
               gradient_ms=median([t["gradient_ms"] for t in times]), step_ms=median([t["step_ms"] for t in times]),
               apply_ms=median([t["apply_ms"] for t in times]),
               distro_share=median([(t["step_ms"] + t["apply_ms"]) / r for t, r in zip(times, rounds)]),
               losses=losses)
    rec["tokens_per_s"] = a.batch * seq / (rec["round_ms"] / 1e3)
    final()
    emit(rec)
    return 0


def build_transformers(torch, text, seed, device):
    """The causal LM of a config.json's text, as transformers builds it from
    the config alone, its weights drawn from seed on the CPU (the global RNG
    left as it was), then moved to device."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    raw = json.loads(text)
    config = transformers.AutoConfig.for_model(raw["model_type"], **{k: v for k, v in raw.items() if k != "model_type"})
    config.use_cache = False
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    # eval: dropout off, as every trainer computes.
    return net.float().eval().to(device)


def transformers_loss(torch, net):
    """The training loss of a plain transformers loop on (inputs, targets):
    the logits of a forward (under autocast when amp is a dtype), each
    token's cross-entropy in float32, their mean summed in float64 (as the
    worker reports the loss; the gradient is the float32 mean's)."""
    import torch.nn.functional as F

    def loss_fn(x, y, amp):
        with torch.autocast(device_type=x.device.type, dtype=amp, enabled=amp is not None):
            logits = net(input_ids=x, use_cache=False).logits
        tok = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), reduction="none")
        return tok.double().mean().float(), None

    return loss_fn


def is_oom(torch, exc):
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    msg = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg)


if __name__ == "__main__":
    sys.exit(main())
