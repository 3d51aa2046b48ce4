"""PyTorch reference for scripts/check-torch (run by it; see there).

Reads what `go run ./trainer/llama/internal/torchref` wrote into DIR: a
Hugging Face Llama directory (DIR/model: config.json, model.safetensors), the
batch and step settings (DIR/run.json) and the Go model's outputs
(DIR/go.safetensors). Computes the same things with PyTorch -- the forward
pass of transformers' LlamaForCausalLM written out here (so the check needs
no transformers install), gradients by autograd, torch.optim.AdamW, and a
DisTrO (DeMo) step with torch tensor ops -- and compares.

The error of a tensor is max|go - torch| / max|torch| (the largest
difference relative to the tensor's scale: an element-wise ratio is
meaningless where a value is near zero). Every one must be <= TOL.
"""

import json
import math
import struct
import sys

import torch

TOL = 1e-4
DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def read_safetensors(path):
    """Reads a safetensors file (the format is 8 bytes of header length, a
    JSON header, the data) into a dict of float32 tensors."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(body[begin:end]), dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).to(torch.float32)
    return out


def rms_norm(x, w, eps):
    # LlamaRMSNorm: in float32 here, as the whole check is.
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope(q, k, theta, t):
    # LlamaRotaryEmbedding (default rope type) and apply_rotary_pos_emb.
    hd = q.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    pos = torch.arange(t, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def llama_forward(w, cfg, ids):
    """LlamaForCausalLM's forward (eager attention, no cache) on ids (B, T)."""
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    C = cfg["hidden_size"]
    hd = C // H
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    B, T = ids.shape
    h = w["model.embed_tokens.weight"][ids]
    mask = torch.full((T, T), float("-inf")).triu(1)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(B, T, H, hd).transpose(1, 2)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(B, T, KV, hd).transpose(1, 2)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(B, T, KV, hd).transpose(1, 2)
        q, k = rope(q, k, theta, T)
        # repeat_kv: each key/value head serves H/KV consecutive query heads
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        att = (q @ k.transpose(2, 3)) / math.sqrt(hd) + mask
        att = torch.softmax(att, dim=-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, C)
        h = h + o @ w[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        gate = torch.nn.functional.silu(x @ w[p + "mlp.gate_proj.weight"].T)
        up = x @ w[p + "mlp.up_proj.weight"].T
        h = h + (gate * up) @ w[p + "mlp.down_proj.weight"].T
    h = rms_norm(h, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return h @ head.T


def dct_matrix(n):
    """The orthonormal DCT-II matrix: row k is the k-th basis vector."""
    k = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    m = torch.cos(math.pi * (2 * i + 1) * k / (2 * n))
    m[0] *= math.sqrt(1 / n)
    m[1:] *= math.sqrt(2 / n)
    return m.float()


def largest_divisor(n, chunk):
    for d in range(min(n, chunk), 1, -1):
        if n % d == 0:
            return d
    return 1


def demo_step(param, grad, scale, run):
    """One DisTrO (DeMo) step of one trainer applied with the mean rule:
    the momentum (zero before) becomes scale*grad, each tile keeps its top-k
    DCT coefficients, their inverse DCT's sign is the update direction."""
    shape = param.shape
    rows = shape[-2] if len(shape) >= 2 else 1
    cols = shape[-1]
    th, tw = largest_divisor(rows, run["Chunk"]), largest_divisor(cols, run["Chunk"])
    k = min(run["TopK"], th * tw)
    g = grad.reshape(-1, rows // th, th, cols // tw, tw).permute(0, 1, 3, 2, 4)  # tiles
    dh, dw = dct_matrix(th), dct_matrix(tw)
    coef = dh @ (scale * g) @ dw.T
    flat = coef.reshape(*coef.shape[:3], th * tw)
    idx = flat.abs().topk(k, dim=-1).indices
    kept = torch.zeros_like(flat).scatter(-1, idx, flat.gather(-1, idx))
    direction = torch.sign(dh.T @ kept.reshape(coef.shape) @ dw)
    direction = direction.permute(0, 1, 3, 2, 4).reshape(shape)
    lr, wd = run["LR"], run["WeightDecay"]
    return param * (1 - lr * wd) - lr * direction


NORM_BETA, NORM_FLOOR = 0.95, 0.1  # distro's normBeta and normFloor


def tiles_of(t, run):
    """The tiles of t (outer, tile rows, tile cols, th, tw) and the inverse."""
    shape = t.shape
    rows = shape[-2] if len(shape) >= 2 else 1
    cols = shape[-1]
    th, tw = largest_divisor(rows, run["Chunk"]), largest_divisor(cols, run["Chunk"])
    tiled = t.reshape(-1, rows // th, th, cols // tw, tw).permute(0, 1, 3, 2, 4)
    return tiled, th, tw, lambda x: x.permute(0, 1, 3, 2, 4).reshape(shape)


def demo_two_normalized(param, grads, scales, run):
    """Two DisTrO steps with normalized gradients, the second one's result
    applied with the mean rule: each DCT coefficient c of a gradient is
    divided by sqrt(v*u) + floor, where v is the running mean square of c
    (decay NORM_BETA), u = 1/(1 - NORM_BETA^step) corrects its bias, and
    floor is NORM_FLOOR times the root of the tile's mean of v*u; the
    momentum is decay*m + scale*(that); top-k is sent and removed."""
    v = m = None
    for step, (g, scale) in enumerate(zip(grads, scales), start=1):
        tiled, th, tw, untile = tiles_of(g.double(), run)
        dh, dw = dct_matrix(th).double(), dct_matrix(tw).double()
        coef = (dh @ tiled @ dw.T).reshape(*tiled.shape[:3], th * tw)
        v = (1 - NORM_BETA) * coef**2 if v is None else NORM_BETA * v + (1 - NORM_BETA) * coef**2
        u = 1 / (1 - NORM_BETA**step)
        floor = NORM_FLOOR * (v.mean(dim=-1, keepdim=True) * u).sqrt()
        normed = coef / ((v * u).sqrt() + floor)
        m = scale * normed if m is None else run["Decay"] * m + scale * normed
        k = min(run["TopK"], th * tw)
        idx = m.abs().topk(k, dim=-1).indices
        kept = torch.zeros_like(m).scatter(-1, idx, m.gather(-1, idx))
        m = m - kept
    direction = torch.sign(dh.T @ kept.reshape(*tiled.shape[:3], th, tw) @ dw)
    lr, wd = run["LR"], run["WeightDecay"]
    return param * (1 - lr * wd) - lr * untile(direction).float()


def clip_scale(grads, run):
    norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
    return run["LR"] * (run["Clip"] / norm if run["Clip"] > 0 and norm > run["Clip"] else 1.0)


def err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def main(d):
    torch.manual_seed(0)
    with open(f"{d}/model/config.json") as f:
        cfg = json.load(f)
    with open(f"{d}/run.json") as f:
        run = json.load(f)
    assert cfg["model_type"] == "llama" and cfg["hidden_act"] == "silu"
    weights = read_safetensors(f"{d}/model/model.safetensors")
    got = read_safetensors(f"{d}/go.safetensors")
    params = {n: t.clone().requires_grad_(True) for n, t in weights.items()}
    B, T = run["B"], run["T"]
    ids = torch.tensor(run["Inputs"], dtype=torch.int64).view(B, T)
    targets = torch.tensor(run["Targets"], dtype=torch.int64).view(B * T)

    logits = llama_forward(params, cfg, ids)
    loss = torch.nn.functional.cross_entropy(logits.view(B * T, -1), targets)
    loss.backward()

    results = [("logits", err(got["logits"], logits.detach())), ("loss", err(got["loss"], loss.detach().view(1)))]
    for n, p in params.items():
        results.append(("grad " + n, err(got["grad." + n], p.grad)))

    # One AdamW step: torch's clip_grad_norm_ then torch.optim.AdamW.
    adam_params = [torch.nn.Parameter(t.clone()) for t in weights.values()]
    for ap, p in zip(adam_params, params.values()):
        ap.grad = p.grad.clone()
    torch.nn.utils.clip_grad_norm_(adam_params, run["Clip"])
    opt = torch.optim.AdamW(adam_params, lr=run["LR"], betas=(run["Beta1"], run["Beta2"]), eps=run["Eps"],
                            weight_decay=run["WeightDecay"])
    opt.step()
    for n, ap in zip(weights, adam_params):
        results.append(("adamw " + n, err(got["adamw." + n], ap.detach())))

    # One DisTrO step from the gradients the Go step used (its inputs are in
    # the file), so that the top-k choice sees the same coefficients.
    grads = [got["distro.grad." + s] for s in run["DistroSpecs"]]
    norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
    scale = run["LR"] * (run["Clip"] / norm if run["Clip"] > 0 and norm > run["Clip"] else 1.0)
    flips = 0
    for s, g in zip(run["DistroSpecs"], grads):
        want = demo_step(got["distro.param." + s], g, scale, run)
        have = got["distro.after." + s]
        # An update is ±lr (or 0): a different sign would differ by 2·lr.
        flips += int(((have - want).abs() > run["LR"]).sum())
        results.append(("distro " + s, err(have, want)))

    # Two steps with normalized gradients, the second one applied.
    grads2 = [got["distro.grad2." + s] for s in run["DistroSpecs"]]
    scales = [clip_scale(grads, run), clip_scale(grads2, run)]
    for s, g1, g2 in zip(run["DistroSpecs"], grads, grads2):
        want = demo_two_normalized(got["distro.param." + s], [g1, g2], scales, run)
        have = got["distro.norm.after." + s]
        flips += int(((have - want).abs() > run["LR"]).sum())
        results.append(("distro normalized, 2 steps " + s, err(have, want)))

    worst = max(e for _, e in results)
    print(f"config: kv_heads={cfg['num_key_value_heads']}/{cfg['num_attention_heads']} tied={cfg['tie_word_embeddings']}")
    for name, e in results:
        print(f"  {name:60s} {e:.2e}")
    print(f"  loss go {got['loss'].item():.6f} torch {loss.item():.6f}; DisTrO sign flips: {flips}")
    print(f"max relative error {worst:.2e} over {len(results)} tensors (limit {TOL:g})")
    if worst > TOL or flips:
        print("FAIL: the Go Llama and the PyTorch reference disagree")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
