"""The Python side of trainer/internal/hfcheck's TestModelsMatchTransformers.

Run as `python hfcheck.py DIR...` by the Go test, with the engine's pinned
environment (torch, transformers, safetensors): one process for every model
the test checks, as importing transformers takes seconds. Each DIR holds
what the test wrote for one model: ours/ (the Go model saved as a Hugging
Face directory, as psyche export writes it), go.safetensors (the Go model's logits and loss on the
batch, and its parameters in its own fused layout as param.<Specs name>)
and run.json (the batch, the architecture and the config in the form the
torch worker's models.build takes).

It checks, on the same weights and batch, in float32:
  * transformers (AutoModelForCausalLM.from_pretrained on ours/, with eager
    and with sdpa attention) against the Go model's logits and loss;
  * the torch worker's model (trainer/engine/torch/worker/models.py,
    scaled_dot_product_attention), given the Go parameters, against
    transformers;
and writes, for the Go test to load and compare: theirs/ (a model of the
same config that transformers built and save_pretrained wrote, safetensors)
and theirs.safetensors (its logits and loss on the batch).

It prints one JSON object: for each DIR, every comparison's name and
error; the Go test judges them. The error of a tensor is
max|got - want| / max|want| with transformers as want (why that measure:
see the Go test).
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "engine", "torch", "worker"))
import models  # noqa: E402  (the torch worker's models)

def rel_err(got, want):
    got, want = got.double(), want.double()
    scale = want.abs().max().item()
    return (got - want).abs().max().item() / scale


def hf_pass(model, ids, targets):
    """Logits [b, t, vocab] and the mean loss of targets (transformers' own
    loss: shift_labels are the targets as given, not the inputs shifted)."""
    with torch.no_grad():
        out = model(input_ids=ids, labels=targets, shift_labels=targets)
    return out.logits, out.loss


def their_model(run):
    """A transformers model of the run's config, transformers' own random
    initialisation plus N(0, 0.1²) on every parameter (so that the norms'
    weights and the biases are not 1 and 0)."""
    c = run["config"]
    if run["arch"] == "gpt":
        cfg = GPT2Config(vocab_size=c["vocab"], n_positions=c["context"], n_embd=c["width"],
                         n_layer=c["layers"], n_head=c["heads"], activation_function="gelu_new",
                         layer_norm_epsilon=1e-5, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0,
                         tie_word_embeddings=True)
        cls = GPT2LMHeadModel
    else:
        cfg = LlamaConfig(vocab_size=c["vocab"], hidden_size=c["width"], num_hidden_layers=c["layers"],
                          num_attention_heads=c["heads"], num_key_value_heads=c["kv_heads"],
                          intermediate_size=c["intermediate"], max_position_embeddings=c["context"],
                          rope_theta=c["rope_theta"], rms_norm_eps=c["norm_eps"],
                          tie_word_embeddings=c["tied_head"])
        cls = LlamaForCausalLM
    torch.manual_seed(run["seed"])
    m = cls(cfg).float().eval()
    with torch.no_grad():
        for p in m.parameters():  # a tied head is one parameter, perturbed once
            p.add_(torch.randn_like(p) * 0.1)
    return m


def check(d):
    with open(os.path.join(d, "run.json")) as f:
        run = json.load(f)
    b, t, vocab = run["B"], run["T"], run["config"]["vocab"]
    ids = torch.tensor(run["Inputs"], dtype=torch.int64).view(b, t)
    targets = torch.tensor(run["Targets"], dtype=torch.int64).view(b, t)
    go = load_file(os.path.join(d, "go.safetensors"))
    errs = {}

    # Ours loaded by transformers, against the Go model.
    ref = None
    for attn in ("eager", "sdpa"):
        m = AutoModelForCausalLM.from_pretrained(os.path.join(d, "ours"), dtype=torch.float32,
                                                 attn_implementation=attn).eval()
        logits, loss = hf_pass(m, ids, targets)
        errs["go logits vs transformers (%s)" % attn] = rel_err(go["logits"].view(b, t, vocab), logits)
        errs["go loss vs transformers (%s)" % attn] = rel_err(go["loss"].view(()), loss)
        if ref is None:
            ref = (logits, loss)
            # The loss by hand, to be sure transformers' loss is the mean
            # cross-entropy of the targets as given (shift_labels).
            by_hand = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
            errs["transformers loss vs its logits' cross-entropy"] = rel_err(loss, by_hand)

    # The torch worker's model (scaled_dot_product_attention) on the Go
    # parameters, against transformers.
    w = models.build(run["arch"], run["config"], "cpu")
    with torch.no_grad():
        for name, p in zip(w.names, w.tensors):
            p.copy_(go["param." + name])
        loss, _ = w.forward_losses(ids, targets)
        logits = w.logits(ids, None).view(b, t, vocab)
    errs["worker logits vs transformers"] = rel_err(logits, ref[0])
    errs["worker loss vs transformers"] = rel_err(loss, ref[1])

    # Theirs: written by transformers, for the Go test to load.
    m = their_model(run)
    m.save_pretrained(os.path.join(d, "theirs"), safe_serialization=True)
    logits, loss = hf_pass(m, ids, targets)
    save_file({"logits": logits.contiguous(), "loss": loss.reshape(1).contiguous()},
              os.path.join(d, "theirs.safetensors"))

    return errs


if __name__ == "__main__":
    print(json.dumps({d: check(d) for d in sys.argv[1:]}))
