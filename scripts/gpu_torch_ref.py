#!/usr/bin/env python3
"""PyTorch reference for the Llama training-step benchmark (trainer/llama/internal/stepbench).

Times forward + backward of transformers' LlamaForCausalLM on the GPU for one of
the shapes below, with the same flags as stepbench, and prints one JSON line:

    python3 scripts/gpu_torch_ref.py --shape 50M --batch 4 --seq 128 --precision bf16 [--steps 10]

    {"impl": "pytorch", "shape": "50M", "batch": 4, "seq": 128, "precision": "bf16",
     "tokens_per_s": ..., "step_ms": ..., "params": ..., "flops_per_token": ...,
     "peak_mem_bytes": ..., "device": "NVIDIA H100 80GB HBM3", ...}

and, when the step cannot run (out of memory, no GPU), the same line with "error".
scripts/gpu-check runs it beside stepbench on a lent GPU machine (torch 2.11,
transformers 5.x there) and tabulates both; its torch-engine stage runs it
with --optimizer adamw (and --compile) beside the torch engine's rounds.

What a step is, chosen so the two implementations do the same work:
  * weights are float32; --precision bf16 runs the step under
    torch.autocast("cuda", dtype=torch.bfloat16) (matrix products in bf16,
    master weights and gradients in fp32), fp32 runs it plainly (PyTorch's
    default: no TF32 for matrix products);
  * a step is model(input_ids=x, labels=x).loss and its backward, with no
    optimizer step (but see --optimizer below); gradients are zeroed with
    set_to_none=False before each step, so every step accumulates into
    existing gradient buffers as the Go trainer does, rather than allocating
    fresh ones;
  * attention is SDPA (attn_implementation="sdpa");
  * 3 warm-up steps (allocator, cuBLAS heuristics, kernel autotuning), then
    --steps timed steps between torch.cuda.synchronize() calls.
With --optimizer adamw a step also takes torch.optim.AdamW's step (fused on
CUDA where torch has it, foreach otherwise): a whole training step, what the
torch engine's round (gradient, DisTrO step, apply) is set against. With
--compile the model is torch.compile'd (the warm-up steps compile it;
compile_s says how long they took).
flops_per_token is trainer/llama's Config.FLOPsPerToken (pass.go), so that MFU
means the same for both columns.
"""

import argparse
import json
import math
import sys
import time

# The benchmark shapes: they must match stepbench's (trainer/llama). Every one
# has rms_norm_eps 1e-5, no biases, SwiGLU MLP, a head tied to the embeddings,
# head_dim = width / heads.
SHAPES = {
    "10M": dict(vocab=256, width=384, layers=6, heads=6, kv_heads=2, intermediate=1024,
                rope_theta=10000.0, tied=True, context=128),
    "50M": dict(vocab=256, width=640, layers=11, heads=10, kv_heads=5, intermediate=1728,
                rope_theta=10000.0, tied=True, context=128),
    "125M": dict(vocab=32000, width=768, layers=12, heads=12, kv_heads=4, intermediate=2048,
                 rope_theta=10000.0, tied=True, context=1024),
    "1B": dict(vocab=128256, width=2048, layers=16, heads=32, kv_heads=8, intermediate=8192,
               rope_theta=500000.0, tied=True, context=2048),
}
RMS_NORM_EPS = 1e-5
WARMUP_STEPS = 3
INPUT_SEED = 1234  # the tokens; the weights use their own seed (below)
WEIGHT_SEED = 1


def flops_per_token(s, seq):
    """trainer/llama Config.FLOPsPerToken(t): 6 per weight of the matrix
    products (forward 2, backward 4), the head counted as vocab x width even
    when tied, plus 6 * layers * t * width for attention's q.k and att.v
    (about half of them masked)."""
    C, L, I, V = s["width"], s["layers"], s["intermediate"], s["vocab"]
    head_dim = C // s["heads"]
    qkv_rows = (s["heads"] + 2 * s["kv_heads"]) * head_dim
    matmul = 6 * (L * (qkv_rows * C + C * C + 3 * I * C) + V * C)
    attention = 6 * L * seq * C
    return float(matmul + attention)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # Both spellings, as Go's flag package (stepbench) takes both: gpu-check
    # passes the same words to each.
    p.add_argument("--shape", "-shape", required=True, choices=sorted(SHAPES))
    p.add_argument("--batch", "-batch", type=int, default=4)
    p.add_argument("--seq", "-seq", type=int, default=128)
    p.add_argument("--precision", "-precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--steps", "-steps", type=int, default=10, help="timed steps (after %d warm-up steps)" % WARMUP_STEPS)
    p.add_argument("--optimizer", "-optimizer", choices=("none", "adamw"), default="none",
                   help="none: forward and backward only (stepbench's step); adamw: and AdamW's step")
    p.add_argument("--compile", "-compile", action="store_true", help="torch.compile the model")
    # Not a benchmark setting: lets the script be smoke-tested on a machine
    # without a GPU (--device cpu, with a small shape).
    p.add_argument("--device", "-device", default="cuda", help=argparse.SUPPRESS)
    return p.parse_args()


def emit(rec):
    # One line, last on stdout: gpu-check takes the last line that parses.
    sys.stdout.flush()
    print(json.dumps(rec), flush=True)


def llama_config(transformers, s, seq):
    """A LlamaConfig with the shape's numbers. transformers 5 keeps RoPE's
    settings in rope_parameters (rope_theta there); 4.x took rope_theta."""
    kw = dict(
        vocab_size=s["vocab"],
        hidden_size=s["width"],
        intermediate_size=s["intermediate"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        head_dim=s["width"] // s["heads"],
        max_position_embeddings=max(s["context"], seq),
        rms_norm_eps=RMS_NORM_EPS,
        hidden_act="silu",
        tie_word_embeddings=s["tied"],
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        use_cache=False,  # training: no key/value cache to allocate
        attn_implementation="sdpa",
    )
    major = int(transformers.__version__.split(".")[0])
    if major >= 5:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": s["rope_theta"]}
    else:
        kw["rope_theta"] = s["rope_theta"]
    cfg = transformers.LlamaConfig(**kw)
    # A silently ignored keyword would benchmark another model: check the
    # settings that decide the shape and the work.
    rp = getattr(cfg, "rope_parameters", None) or {}
    theta = rp.get("rope_theta", getattr(cfg, "rope_theta", None))
    if theta is None or float(theta) != s["rope_theta"]:
        raise RuntimeError("LlamaConfig did not take rope_theta %g (has %r)" % (s["rope_theta"], theta))
    if cfg.tie_word_embeddings != s["tied"]:
        raise RuntimeError("LlamaConfig did not take tie_word_embeddings")
    return cfg


def main():
    a = parse_args()
    s = SHAPES[a.shape]
    rec = dict(impl="pytorch", shape=a.shape, batch=a.batch, seq=a.seq, precision=a.precision,
               tokens_per_s=None, step_ms=None, params=None, flops_per_token=flops_per_token(s, a.seq),
               peak_mem_bytes=None, device=None, optimizer=a.optimizer, compile=a.compile)
    if a.seq > s["context"]:
        rec["error"] = "seq %d exceeds shape %s's context %d" % (a.seq, a.shape, s["context"])
        emit(rec)
        return 2
    if a.batch < 1 or a.steps < 1:
        rec["error"] = "batch and steps must be at least 1"
        emit(rec)
        return 2

    try:
        import torch
        import transformers
    except Exception as e:  # noqa: BLE001 - reported, not raised
        rec["error"] = "import: %s" % e
        emit(rec)
        return 1
    rec["torch"] = torch.__version__
    rec["transformers"] = transformers.__version__

    cuda = a.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        rec["error"] = "CUDA is not available to torch"
        emit(rec)
        return 1
    device = torch.device(a.device)
    rec["device"] = torch.cuda.get_device_name(device) if cuda else a.device

    def peak():
        return torch.cuda.max_memory_allocated(device) if cuda else None

    try:
        torch.manual_seed(WEIGHT_SEED)
        cfg = llama_config(transformers, s, a.seq)
        # Built on the device directly: the 1B shape takes long to initialize
        # on the CPU. float32 weights whatever the precision (autocast casts).
        with device:
            model = transformers.LlamaForCausalLM(cfg)
        model = model.to(device=device, dtype=torch.float32)
        model.train()
        attn = getattr(model.config, "_attn_implementation", None)
        if attn != "sdpa":
            raise RuntimeError("attention implementation is %r, not sdpa" % attn)
        rec["attn"] = attn
        # parameters() yields a tied weight once, as the Go model stores it.
        rec["params"] = sum(p.numel() for p in model.parameters())

        g = torch.Generator(device="cpu").manual_seed(INPUT_SEED)
        x = torch.randint(0, s["vocab"], (a.batch, a.seq), generator=g, dtype=torch.long).to(device)

        opt = None
        if a.optimizer == "adamw":
            kw = {}
            if cuda and "fused" in torch.optim.AdamW.__init__.__code__.co_varnames:
                kw["fused"] = True
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **kw)
            rec["adamw"] = "fused" if kw else "default"
        if a.compile and not hasattr(torch, "compile"):
            raise RuntimeError("torch %s has no torch.compile" % torch.__version__)
        fwd = torch.compile(model) if a.compile else model

        def step():
            model.zero_grad(set_to_none=False)
            if a.precision == "bf16":
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    loss = fwd(input_ids=x, labels=x).loss
            else:
                loss = fwd(input_ids=x, labels=x).loss
            loss.backward()
            if opt is not None:
                opt.step()
            return loss

        tw = time.perf_counter()
        for _ in range(WARMUP_STEPS):
            loss = step()
        if cuda:
            torch.cuda.synchronize(device)
        rec["compile_s" if a.compile else "warmup_s"] = time.perf_counter() - tw
        t0 = time.perf_counter()
        for _ in range(a.steps):
            loss = step()
        if cuda:
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - t0
    except torch.cuda.OutOfMemoryError as e:
        rec["error"] = "out of memory: " + str(e).split("\n")[0]
        rec["peak_mem_bytes"] = peak()
        emit(rec)
        return 0  # an answer, not a failure of the script
    except Exception as e:  # noqa: BLE001 - reported as the line's error
        rec["error"] = "%s: %s" % (type(e).__name__, str(e).split("\n")[0])
        rec["peak_mem_bytes"] = peak() if cuda and torch.cuda.is_available() else None
        emit(rec)
        return 1

    tokens = a.batch * a.seq * a.steps
    rec.update(
        tokens_per_s=tokens / elapsed,
        step_ms=1000 * elapsed / a.steps,
        peak_mem_bytes=peak(),
        steps=a.steps,
        loss=float(loss.detach()),  # about ln(vocab) on random weights: a sanity check
        ln_vocab=math.log(s["vocab"]),
    )
    emit(rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
