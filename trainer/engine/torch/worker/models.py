"""PyTorch transcriptions of psyche's Go language models, for the torch engine.

build("gpt", cfg, device) is trainer/gpt and build("llama", cfg, device) is
trainer/llama: the same parameter tensors in the same order and shapes as
the Go model's Tensors()/Shapes() (so the Go side can send weights and read
gradients tensor by tensor, by index), and the same arithmetic:

  * GPT: token + position embeddings; pre-norm blocks with LayerNorm
    (eps kernels.LayerNormEps, sent by psyche), a fused q|k|v projection with bias,
    causal attention scaled by 1/sqrt(head size), GELU's tanh form, an MLP
    4x wide; a final LayerNorm and a head tied to the token embeddings.
  * Llama: token embeddings; pre-norm blocks with RMSNorm (eps from the
    config), a fused q|k|v projection without bias (query heads, then
    key/value heads), rotary embeddings on the query and key heads (the
    two halves of a head rotate together, Hugging Face's rotate_half
    layout), grouped-query attention (query head h reads key/value head
    h // (heads / kv_heads)), a fused gate|up projection feeding SwiGLU, a
    final RMSNorm and a head (its own tensor, or the embeddings when tied).
  * Loss: each token's cross-entropy of its target; the batch loss is
    their mean and a sequence's loss the mean of its tokens, both summed
    in float64 as lm.MeanLoss and lm.SequenceLosses sum.

Only torch (2.6 or newer, as worker.py requires) is needed. Attention is
torch's scaled_dot_product_attention, grouped queries included (enable_gqa),
so that torch picks its fused kernel for the device and torch.compile sees
one attention op.
"""

import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

# The Go cross-entropy takes -log(max(p, 1e-30)) of the target's
# probability, so a token's loss never exceeds this (only reached when a
# probability underflows float32, i.e. a diverged model).
LOSS_CAP = -math.log(1e-30)


class Model(torch.nn.Module):
    """A language model whose parameters are the Go model's tensors.

    tensors: the parameters in the Go model's Tensors() order, each of the
    Go shape (layers stacked on the first axis), float32, zero at first.
    names: the Go Specs() names of the same tensors.
    """

    arch = ""

    def __init__(self) -> None:
        super().__init__()
        self.names: List[str] = []
        self.tensors: List[torch.nn.Parameter] = []

    def _add_tensors(self, specs: Sequence[Tuple[str, Tuple[int, ...]]], device: torch.device) -> None:
        self.names = [n for n, _ in specs]
        params = []
        for name, shape in specs:
            p = torch.nn.Parameter(torch.zeros(shape, dtype=torch.float32, device=device))
            # Module attribute names may not hold dots.
            self.register_parameter(name.replace(".", "_"), p)
            params.append(p)
        # A plain list (not a ParameterList) of the registered parameters:
        # the worker copies weights in and reads gradients out by index.
        self.tensors = params

    @property
    def device(self) -> torch.device:
        return self.tensors[0].device

    def num_params(self) -> int:
        return sum(p.numel() for p in self.tensors)

    def shapes(self) -> List[List[int]]:
        return [list(p.shape) for p in self.tensors]

    # Which tensors (indices into tensors) are stacked per layer ([L, ...]),
    # in the order block takes a layer's slices, and which of those the
    # matrix products use (cast to the autocast dtype; the norms' stay
    # float32). The rest (embeddings, final norm, head) go to embed_tokens
    # and head.
    layer_index: List[int] = []
    layer_cast: List[bool] = []

    @property
    def rest_index(self) -> List[int]:
        stacked = set(self.layer_index)
        return [i for i in range(len(self.tensors)) if i not in stacked]

    # Whether the head is the token embeddings (rest[0]) itself.
    tied_head = False

    def logits(self, inputs: torch.Tensor, amp_dtype: Optional[torch.dtype]) -> torch.Tensor:
        """The head's output for inputs [b, t]: [b*t, vocab], float32 or
        amp_dtype (call inside autocast when amp_dtype is set)."""
        rest = [self.tensors[i] for i in self.rest_index]
        head_rest, lookup = rest, F.embedding
        if amp_dtype is None and torch.is_grad_enabled() and not torch.compiler.is_compiling():
            # A float32 pass with a backward to come, eager: each gradient
            # goes into the parameter's .grad as soon as autograd has it
            # (layer_leaves, TiedGrad), rather than whole at the end of the
            # backward beside its parts. torch.compile and autocast keep
            # autograd's own way (the graph's backward, the cast stacks).
            stacked = [layer_leaves(self.tensors[i]) for i in self.layer_index]
            if self.tied_head:
                tied = TiedGrad(rest[0])
                head_rest, lookup = [tied.head_leaf()] + rest[1:], tied.lookup
        else:
            stacked = [layer_views(self.tensors[i], amp_dtype if cast else None)
                       for i, cast in zip(self.layer_index, self.layer_cast)]
        x, extra = self.embed_tokens(inputs, rest, lookup)
        for l in range(self.layers):
            x = self.block(x, [s[l] for s in stacked], extra)
        return self.head(x, head_rest)

    def embed_tokens(self, inputs: torch.Tensor, rest: Sequence[torch.Tensor],
                     lookup: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.embedding
                     ) -> Tuple[torch.Tensor, object]:
        """The residual stream [b, t, C] before the first block, and what
        every block needs besides its own tensors (Llama: the rotary
        tables); lookup(inputs, weight) is the token embeddings' (the
        tensor rest[0]). GPT and Llama define it, block and head; this base
        class is never built on its own."""
        raise TypeError("%s is not a model psyche builds (GPT or Llama)" % type(self).__name__)

    def block(self, x: torch.Tensor, ps: Sequence[torch.Tensor], extra: object) -> torch.Tensor:
        """One transformer block on x [b, t, C], given its layer's slice of
        each stacked tensor (layer_index order)."""
        raise TypeError("%s is not a model psyche builds (GPT or Llama)" % type(self).__name__)

    def head(self, x: torch.Tensor, rest: Sequence[torch.Tensor]) -> torch.Tensor:
        raise TypeError("%s is not a model psyche builds (GPT or Llama)" % type(self).__name__)

    def real_buffers(self, device: torch.device) -> None:
        """Computes the model's buffers on device (a model built on the meta
        device, whose parameters live elsewhere: fsdp.py)."""

    def forward_losses(self, inputs: torch.Tensor, targets: torch.Tensor,
                       amp_dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """The mean loss of predicting targets from inputs (both int64
        [b, t]) as Go's Forward returns it, and each sequence's loss
        (float32 [b], detached) as Go's SequenceLosses(t). loss.backward()
        adds Go's Backward gradients to the tensors' .grad.

        With amp_dtype (torch.bfloat16, say) the matrix products and
        attention run under autocast in that dtype; the weights stay
        float32 (the gradients too), the norms and the loss are float32."""
        b, t = inputs.shape
        return token_losses_to_means(self.token_losses(inputs, targets, amp_dtype), b, t)

    def token_losses(self, inputs: torch.Tensor, targets: torch.Tensor,
                     amp_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """Each token's loss, [b*t] float32 (a rank of a multi-device
        worker sums its share of a batch's tokens and divides by the whole
        batch's count, so that the ranks' gradients add up to the mean's)."""
        if amp_dtype is None:
            logits = self.logits(inputs, None)
        else:
            with torch.autocast(device_type=self.device.type, dtype=amp_dtype):
                logits = self.logits(inputs, amp_dtype)
        return cross_entropy(logits, targets.reshape(-1).long())

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor,
                amp_dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.forward_losses(inputs, targets, amp_dtype)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each row's cross-entropy (float32, whatever the logits' dtype), capped
    as Go caps it. The cap leaves the gradient alone: Go's backward is
    softmax - onehot for every row, capped or not."""
    ce = F.cross_entropy(at_least_float32(logits), targets, reduction="none")
    return ce - (ce - ce.clamp(max=LOSS_CAP)).detach()


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    # float32 for the narrow dtypes autocast makes; float64 stays (a model
    # converted with .double() serves as a precise reference in tests).
    return x if x.dtype == torch.float64 else x.float()


def token_losses_to_means(tok: torch.Tensor, b: int, t: int) -> Tuple[torch.Tensor, torch.Tensor]:
    # float64 sums, rounded to float32, as lm.MeanLoss and lm.SequenceLosses.
    tok64 = tok.double()
    loss = tok64.mean().to(tok.dtype)
    seq = tok64.detach().view(b, t).mean(dim=1).to(tok.dtype)
    return loss, seq


def layer_views(p: torch.Tensor, dtype: Optional[torch.dtype]) -> Tuple[torch.Tensor, ...]:
    """The per-layer tensors of a stacked [L, ...] parameter. unbind's
    backward stacks the layers' gradients in one copy (indexing p[l] would
    make a full-size zero gradient per layer). Under autocast the whole
    stack is cast once (what autocast would do layer by layer), so the
    gradients are stacked in the narrow dtype too."""
    if dtype is not None:
        p = p.to(dtype)
    return p.unbind(0)


def layer_leaves(p: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """The layers of a stacked [L, ...] parameter as leaves of their own
    (views of p, the same memory) whose gradient is copied into its layer
    of p.grad as soon as autograd has it, and let go.

    unbind's backward (layer_views) waits for every layer's gradient and
    stacks them into a new tensor: for that moment the tensor's gradient
    is held twice (at Qwen2.5-0.5B's shape the MLP's gate|up, 0.78 GiB,
    at the backward's peak). Here it is held once, and a layer's more.
    The bits are unbind's: each layer's gradient copied, and a layer no
    gradient reached zero. p.grad, when the pass starts with one, is added
    to (as autograd would)."""
    add = p.grad is not None
    base = p.detach()

    def keep(l: int, leaf: torch.Tensor) -> None:
        with torch.no_grad():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if add:
                p.grad[l].add_(leaf.grad)
            else:
                p.grad[l].copy_(leaf.grad)
        leaf.grad = None

    leaves = []
    for l in range(p.shape[0]):
        leaf = base[l].requires_grad_()
        leaf.register_post_accumulate_grad_hook(lambda leaf, l=l: keep(l, leaf))
        leaves.append(leaf)
    return tuple(leaves)


class TiedGrad:
    """The gradient of token embeddings that are also the head, from its
    two uses, summed into p.grad without a dense gradient of the lookup.

    Autograd would give the lookup a gradient of the embeddings' whole
    size, zero but for the rows of the tokens seen, and sum it with the
    head's: two such tensors at once (at Qwen2.5-0.5B's shape 0.54 GiB
    each). Here the lookup's backward computes the seen rows alone and
    adds them to the head's gradient in place. The bits are autograd's:
    each row of the lookup sums its tokens' gradients in their order
    (embedding's own backward, over the distinct tokens), and the head's
    gradient g becomes g + e, e being +0 off the seen rows (which turns a
    -0 there into +0)."""

    def __init__(self, p: torch.Tensor) -> None:
        self.p = p
        self.add = p.grad is not None
        self.head: Optional[torch.Tensor] = None  # the head's gradient, once autograd has it
        self.rows: Optional[Tuple[torch.Tensor, torch.Tensor]] = None  # the lookup's: tokens, their rows

    def head_leaf(self) -> torch.Tensor:
        """The embeddings as the head uses them (a leaf viewing p)."""
        leaf = self.p.detach().requires_grad_()
        leaf.register_post_accumulate_grad_hook(self._took_head)
        return leaf

    def lookup(self, inputs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return _TiedLookup.apply(weight.detach().requires_grad_(), inputs, self)

    def _took_head(self, leaf: torch.Tensor) -> None:
        self.head, leaf.grad = leaf.grad, None
        self._sum()

    def took_rows(self, tokens: torch.Tensor, rows: torch.Tensor) -> None:
        self.rows = (tokens, rows)
        self._sum()

    def _sum(self) -> None:
        if self.head is None or self.rows is None:
            return
        g, (tokens, rows) = self.head, self.rows
        self.head = self.rows = None
        with torch.no_grad():
            seen = g.index_select(0, tokens).add_(rows)
            g.add_(0.0)  # g + e off the seen rows: -0 + 0 is +0
            g.index_copy_(0, tokens, seen)
            if not self.add:
                self.p.grad = g
            else:
                self.p.grad.add_(g)


class _TiedLookup(torch.autograd.Function):
    """F.embedding whose backward hands TiedGrad the gradient's rows of the
    tokens seen, and autograd nothing."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, inputs: torch.Tensor, tied: TiedGrad) -> torch.Tensor:
        ctx.save_for_backward(inputs)
        ctx.tied = tied
        return F.embedding(inputs, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (inputs,) = ctx.saved_tensors
        tokens, at = torch.unique(inputs, return_inverse=True)
        # Embedding's backward as autograd runs it (no padding index, no
        # scaling by frequency), over the distinct tokens in place of the
        # vocabulary: each row sums its tokens' gradients in their order.
        rows = torch.ops.aten.embedding_dense_backward(grad, at, tokens.numel(), -1, False)
        ctx.tied.took_rows(tokens, rows)
        return None, None, None


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(d) + causal mask) v for q [b, heads, t, d] and k,
    v [b, kv_heads, t, d], query head h reading key/value head h // (heads /
    kv_heads) (Go's gqaLayout: consecutive query heads share one)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])


class GPT(Model):
    arch = "gpt"
    tied_head = True  # the head is wte

    def __init__(self, cfg: Dict, device: torch.device):
        super().__init__()
        V, T, C, L, H = (int(cfg[k]) for k in ("vocab", "context", "width", "layers", "heads"))
        if min(V, T, C, L, H) <= 0:
            raise ValueError("gpt: vocab, context, width, layers and heads must be positive: %r" % (cfg,))
        if C % H:
            raise ValueError("gpt: heads (%d) must divide width (%d)" % (H, C))
        self.vocab, self.context, self.width, self.layers, self.heads = V, T, C, L, H
        # LayerNorm's epsilon, fixed for the architecture: psyche sends its
        # kernels' (kernels.LayerNormEps).
        self.norm_eps = float(cfg["norm_eps"])
        # trainer/gpt Config.Specs.
        specs = [
            ("wte", (V, C)),
            ("wpe", (T, C)),
            ("ln1.weight", (L, C)),
            ("ln1.bias", (L, C)),
            ("attn.qkv.weight", (L, 3 * C, C)),
            ("attn.qkv.bias", (L, 3 * C)),
            ("attn.proj.weight", (L, C, C)),
            ("attn.proj.bias", (L, C)),
            ("ln2.weight", (L, C)),
            ("ln2.bias", (L, C)),
            ("mlp.fc.weight", (L, 4 * C, C)),
            ("mlp.fc.bias", (L, 4 * C)),
            ("mlp.proj.weight", (L, C, 4 * C)),
            ("mlp.proj.bias", (L, C)),
            ("lnf.weight", (C,)),
            ("lnf.bias", (C,)),
        ]
        self._add_tensors(specs, device)

    # ln1 (weight, bias), attn.qkv, attn.proj, ln2, mlp.fc, mlp.proj.
    layer_index = list(range(2, 14))
    layer_cast = [False, False, True, True, True, True, False, False, True, True, True, True]

    def embed_tokens(self, inputs: torch.Tensor, rest: Sequence[torch.Tensor],
                     lookup: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.embedding
                     ) -> Tuple[torch.Tensor, object]:
        t = inputs.shape[1]
        if t > self.context:
            raise ValueError("gpt: %d tokens exceed the context of %d" % (t, self.context))
        wte, wpe = rest[0], rest[1]
        # The residual stream is float32 throughout (float32 + amp_dtype
        # promotes), as Go keeps it.
        return lookup(inputs, wte) + wpe[:t], None

    def block(self, x: torch.Tensor, ps: Sequence[torch.Tensor], extra: object) -> torch.Tensor:
        b, t, C = x.shape
        H = self.heads
        hd = C // H
        # The norms' weights are float32 (LayerNorm runs in float32 under
        # autocast); the products' weights and biases come in amp_dtype.
        ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb = ps
        h = F.layer_norm(x, (C,), ln1w, ln1b, self.norm_eps)
        # A qkv row is q | k | v, each C wide with head h at h*hd.
        qkv = F.linear(h, qkvw, qkvb).view(b, t, 3, H, hd)
        q, k, v = [z.transpose(1, 2) for z in qkv.unbind(2)]
        y = causal_attention(q, k, v).transpose(1, 2).reshape(b, t, C)
        x = x + F.linear(y, projw, projb)
        h = F.layer_norm(x, (C,), ln2w, ln2b, self.norm_eps)
        h = F.gelu(F.linear(h, fcw, fcb), approximate="tanh")
        return x + F.linear(h, fcprojw, fcprojb)

    def head(self, x: torch.Tensor, rest: Sequence[torch.Tensor]) -> torch.Tensor:
        b, t, C = x.shape
        wte, _, lnfw, lnfb = rest
        x = F.layer_norm(x, (C,), lnfw, lnfb, self.norm_eps)
        # The head is the token embedding, no bias.
        return F.linear(x, wte).view(b * t, self.vocab)


def rope_tables(context: int, hd: int, theta: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of pos * theta^(-2i/hd), [context, hd/2] float32, rounded
    as Go's ropeTable (after Hugging Face): the exponent 2i/hd in float32,
    the inverse frequency float32(1 / theta^exponent) computed in float64,
    the angle the float32 product of position and inverse frequency, its
    cos and sin in float64 then rounded."""
    theta32 = float(torch.tensor(theta, dtype=torch.float32))
    exponent = torch.arange(0, hd, 2, dtype=torch.float32) / hd
    inv = (1.0 / torch.pow(torch.tensor(theta32, dtype=torch.float64), exponent.double())).float()
    angle = torch.arange(context, dtype=torch.float32)[:, None] * inv[None, :]
    return angle.double().cos().float(), angle.double().sin().float()


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates x [b, t, heads, hd] by position: element i of a head's first
    half pairs with element i of its second half (Go's RoPE). Computed in
    float32 (Go's precision; Hugging Face under autocast does the same, its
    cos and sin being float32), stored back in x's dtype."""
    half = x.shape[-1] // 2
    xf = at_least_float32(x)
    x0, x1 = xf[..., :half], xf[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x0 * c - x1 * s, x1 * c + x0 * s), dim=-1).to(x.dtype)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # In float32 as Go's RMSNorm: y = x * rsqrt(mean(x²) + eps) * w.
    xf = at_least_float32(x)
    return xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * w


class Llama(Model):
    arch = "llama"

    def __init__(self, cfg: Dict, device: torch.device):
        super().__init__()
        V, T, C, L = (int(cfg[k]) for k in ("vocab", "context", "width", "layers"))
        H, KV, I = int(cfg["heads"]), int(cfg["kv_heads"]), int(cfg["intermediate"])
        theta = float(cfg["rope_theta"])
        eps = float(cfg["norm_eps"])  # psyche fills in the default (llama.DefaultNormEps)
        tied = bool(cfg.get("tied_head", False))
        if min(V, T, C, L, I) <= 0:
            raise ValueError("llama: vocab, context, width, layers and intermediate must be positive: %r" % (cfg,))
        if H <= 0 or C % H or (C // H) % 2:
            raise ValueError("llama: heads (%d) must divide width (%d) into heads of an even size" % (H, C))
        if KV <= 0 or KV > H or H % KV:
            raise ValueError("llama: kv heads (%d) must be positive and divide heads (%d)" % (KV, H))
        if not (theta > 1 and math.isfinite(theta)):
            raise ValueError("llama: rope theta (%g) must be finite and greater than 1" % theta)
        if not 0 <= eps < 1:
            raise ValueError("llama: norm eps (%g) must be in [0, 1)" % eps)
        self.vocab, self.context, self.width, self.layers = V, T, C, L
        self.heads, self.kv_heads, self.intermediate = H, KV, I
        self.head_dim = C // H
        self.rope_theta, self.norm_eps, self.tied_head = theta, eps, tied
        # trainer/llama Config.Specs: the head last, absent when tied.
        W = (H + 2 * KV) * self.head_dim
        specs = [
            ("embed", (V, C)),
            ("attn_norm.weight", (L, C)),
            ("attn.qkv.weight", (L, W, C)),
            ("attn.o.weight", (L, C, C)),
            ("mlp_norm.weight", (L, C)),
            ("mlp.gate_up.weight", (L, 2 * I, C)),
            ("mlp.down.weight", (L, C, I)),
            ("norm.weight", (C,)),
        ]
        if not tied:
            specs.append(("head.weight", (V, C)))
        self._add_tensors(specs, device)
        # Computed once for the whole context, sliced per batch; buffers so
        # that .to(device) moves them, not saved with the weights.
        cos, sin = rope_tables(T, self.head_dim, theta)
        self.register_buffer("rope_cos", cos.to(device), persistent=False)
        self.register_buffer("rope_sin", sin.to(device), persistent=False)

    # attn_norm, attn.qkv, attn.o, mlp_norm, mlp.gate_up, mlp.down.
    layer_index = list(range(1, 7))
    layer_cast = [False, True, True, False, True, True]

    def real_buffers(self, device: torch.device) -> None:
        cos, sin = rope_tables(self.context, self.head_dim, self.rope_theta)
        self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)

    def embed_tokens(self, inputs: torch.Tensor, rest: Sequence[torch.Tensor],
                     lookup: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.embedding
                     ) -> Tuple[torch.Tensor, object]:
        t = inputs.shape[1]
        if t > self.context:
            raise ValueError("llama: %d tokens exceed the context of %d" % (t, self.context))
        return lookup(inputs, rest[0]), (self.rope_cos[:t], self.rope_sin[:t])

    def block(self, x: torch.Tensor, ps: Sequence[torch.Tensor], extra: object) -> torch.Tensor:
        b, t, C = x.shape
        H, KV, hd, eps = self.heads, self.kv_heads, self.head_dim, self.norm_eps
        cos, sin = extra
        attn_norm, qkvw, ow, mlp_norm, gate_up, down = ps
        h = rms_norm(x, attn_norm, eps)
        # A qkv row is H query heads, then KV key heads, then KV value
        # heads; the rotation turns the first H+KV (queries and keys).
        qkv = F.linear(h, qkvw).view(b, t, H + 2 * KV, hd)
        qk, v = qkv.split([H + KV, KV], dim=2)
        q, k = rope(qk, cos, sin).split([H, KV], dim=2)
        y = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2).reshape(b, t, C)
        x = x + F.linear(y, ow)
        h = rms_norm(x, mlp_norm, eps)
        # A gate_up row is the gate (I wide), then the up projection.
        gate, up = F.linear(h, gate_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, down)

    def head(self, x: torch.Tensor, rest: Sequence[torch.Tensor]) -> torch.Tensor:
        b, t, C = x.shape
        # rest: the embeddings, the final norm, and the head when untied.
        head = rest[0] if self.tied_head else rest[2]
        x = rms_norm(x, rest[1], self.norm_eps)
        return F.linear(x, head).view(b * t, self.vocab)


class UnknownArchitecture(ValueError):
    """An architecture name psyche's models do not have."""


def build(arch: str, cfg: Dict, device: torch.device) -> Model:
    """A model of the given architecture ("gpt" or "llama") and config (the
    keys are listed on GPT and Llama), its tensors zero float32 on device."""
    device = torch.device(device)
    if arch == "gpt":
        return GPT(cfg, device)
    if arch == "llama":
        return Llama(cfg, device)
    raise UnknownArchitecture("unknown architecture %r (want gpt, llama or transformers)" % (arch,))
