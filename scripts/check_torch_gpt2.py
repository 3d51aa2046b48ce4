"""PyTorch GPT-2 reference for scripts/check-torch (run by it; see there).

Reads what `go run ./trainer/gpt/internal/torchref` wrote into DIR: a Hugging
Face GPT-2 directory (DIR/model: config.json, model.safetensors, as `psyche
export --to hf` writes it), the batch (DIR/run.json) and the Go model's
outputs (DIR/go.safetensors). Computes the same with PyTorch -- the forward
pass of transformers' GPT2LMHeadModel written out here from its definition
(Conv1D layers y = x W + b with W stored in x out; pre-norm blocks; causal
attention scaled by 1/sqrt(head size); GELU's tanh form, "gelu_new"; the
head tied to the token embedding), so the check needs no transformers
install -- and its gradients by autograd, and compares.

The error of a tensor is max|go - torch| / max|torch|; every one must be
<= TOL.
"""

import json
import math
import sys

import torch

from check_torch import read_safetensors, err

TOL = 1e-4


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def forward(w, cfg, ids):
    b, t = ids.shape
    c, heads, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    hd = c // heads
    h = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][torch.arange(t)]
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
    for i in range(cfg["n_layer"]):
        p = lambda s: w[f"transformer.h.{i}.{s}"]
        a = torch.nn.functional.layer_norm(h, (c,), p("ln_1.weight"), p("ln_1.bias"), eps)
        qkv = a @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
        q, k, v = qkv.split(c, dim=-1)
        q, k, v = (x.view(b, t, heads, hd).transpose(1, 2) for x in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        s = s.masked_fill(~mask, float("-inf"))
        y = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(b, t, c)
        h = h + (y @ p("attn.c_proj.weight") + p("attn.c_proj.bias"))
        m = torch.nn.functional.layer_norm(h, (c,), p("ln_2.weight"), p("ln_2.bias"), eps)
        m = gelu_new(m @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"))
        h = h + (m @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias"))
    h = torch.nn.functional.layer_norm(h, (c,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    return h @ w["transformer.wte.weight"].T


def main(d):
    torch.manual_seed(0)
    cfg = json.load(open(f"{d}/model/config.json"))
    assert cfg["model_type"] == "gpt2" and cfg["activation_function"] == "gelu_new" and cfg["tie_word_embeddings"]
    weights = read_safetensors(f"{d}/model/model.safetensors")
    got = read_safetensors(f"{d}/go.safetensors")
    run = json.load(open(f"{d}/run.json"))
    b, t = run["B"], run["T"]
    ids = torch.tensor(run["Inputs"]).view(b, t)
    targets = torch.tensor(run["Targets"]).view(b, t)
    w = {k: v.clone().double().requires_grad_(True) for k, v in weights.items()}
    logits = forward(w, cfg, ids)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    worst = 0.0
    checks = [("logits", got["logits"], logits.detach()), ("loss", got["loss"], loss.detach().view(1))]
    for name in weights:
        checks.append(("grad." + name, got["grad." + name], w[name].grad))
    for name, g, ref in checks:
        e = err(g, ref.float())
        worst = max(worst, e)
        if e > TOL:
            print(f"FAIL {name}: error {e:.3g} > {TOL}")
            sys.exit(1)
    print(f"ok: GPT-2 layout, {len(checks)} tensors (logits, loss, {len(weights)} gradients), largest error {worst:.2g}")


if __name__ == "__main__":
    main(sys.argv[1])
