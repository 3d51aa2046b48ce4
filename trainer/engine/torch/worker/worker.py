"""psyche's PyTorch worker: the engine's half that runs next to torch.

psyche starts this file (embedded in its binary) and drives it over two
pipes: requests arrive on fd 3, answers leave on fd 4 (the framing and
every constant the two sides share: protocol.py and protocol.json; the Go
side is trainer/engine/torch/wire.go and protocol.go). The worker holds one
model, its gradient and its DisTrO state and answers one request at a time;
it exits when fd 3 closes. Its parts:

    protocol.py   the framing, the error kinds, what psyche and the worker share
    ops.py        a handler for each request
    placement.py  where the model lives: one device, data parallel or sharded ranks
    registry.py   the architectures: psyche's GPT and Llama (models.py), transformers (hf.py)
    distro.py     DisTrO's step and apply on the device
    ranks.py      a multi-device worker's processes and collectives (fsdp.py: FSDP2)
    tensors.py    blobs to tensors, devices, memory

stdout and stderr are free for torch's own output; lines starting with
protocol.json's log prefix are what psyche logs at info level.
"""

import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol  # noqa: E402  (beside this file; the standard library only)
from protocol import Kind, Op, Refused, read_message, say  # noqa: E402

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
import torch  # noqa: E402

# The oldest torch the worker runs on (protocol.json's min_torch):
# transformers 5 needs it, and it is the first with FSDP2's fully_shard
# under torch.distributed.fsdp. An older one (Debian bookworm's
# python3-torch is 1.13) is refused like a missing one. torch.__version__
# compares as a version, not as text.
if torch.__version__ < protocol.MIN_TORCH:
    protocol.refuse_start("torch %s is older than %s" % (torch.__version__, protocol.MIN_TORCH), torch=str(torch.__version__))
import ops  # noqa: E402  (beside this file)
from tensors import cpu_threads, is_oom  # noqa: E402


def rank_main(argv) -> int:
    """A rank > 0 of a multi-device worker: rank 0 started it (ranks.py)."""
    args = dict(zip(argv[0::2], argv[1::2]))
    import ranks  # noqa: E402
    ranks.die_with_parent(int(args["--parent"]))
    rank = int(args["--rank"])
    devices = args["--devices"].split(",")
    device = torch.device(devices[rank])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    cpu_threads(len(devices))
    g = ranks.Group(rank, devices, args["--backend"], float(args["--timeout"]),
                    os.path.dirname(os.path.abspath(__file__)))
    g.join(int(args["--cmd-fd"]), int(args["--report-fd"]))
    w = ops.Worker(device, g)
    handlers = w.handlers()
    while True:
        h = w.g.recv()
        if h is None:
            return 0
        try:
            handlers[h["op"]](h, None)
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
    answers = protocol.Answers(wr)
    w = ops.Worker(answers=answers)
    handlers = w.handlers()
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
            if op == Op.HELLO and h.get("protocol") != protocol.VERSION:
                raise Refused(Kind.INPUT, "protocol %s, this worker speaks %d" % (h.get("protocol"), protocol.VERSION))
            fn = handlers.get(op)
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
        answers.write(ans, out)
        # Let go of the request's blobs and the answer's before waiting for
        # the next request, which may be long in coming: an open's weights
        # or a tensor read whole would otherwise stay in memory until then.
        h = blobs = ans = out = None


if __name__ == "__main__":
    sys.exit(main())
