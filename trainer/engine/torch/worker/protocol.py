"""The worker protocol: its framing and what psyche and the worker share.

Every value both languages need lives in protocol.json beside this file;
the Go side reads the same file (trainer/engine/torch/protocol.go), so the
two cannot drift apart. A message, either way, is

    u32 little-endian header length | JSON header | blobs back to back

where the header's "blobs" lists each blob's byte length. A request's header
names its "op"; an answer says "ok", and when not ok an "error" and its
"kind" (Kind). This module needs only the standard library: it answers even
from a python that lacks numpy or torch (refuse_start).

    python3 protocol.py      # prints what this side read, as JSON (a Go test compares)
"""

import enum
import json
import os
import struct
import sys
import threading
from typing import BinaryIO, Dict, List, Optional, Sequence, Tuple, TypedDict

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol.json"), "rb") as _f:
    SPEC = json.load(_f)

VERSION: int = SPEC["version"]
MIN_TORCH: str = SPEC["min_torch"]
DEFAULT_TIMEOUT_S: float = float(SPEC["default_timeout_s"])
# stdout and stderr are free for torch's own output; psyche logs the lines
# that begin with this at info level.
LOG_PREFIX: str = SPEC["log_prefix"]

# The error kinds of a failed answer, named after protocol.json's keys
# (Kind.OOM is "oom"): a kind the file does not declare does not exist here.
Kind = enum.Enum("Kind", {k.upper(): k for k in SPEC["kinds"]}, type=str)

# The ops a request may name, after protocol.json's keys (Op.SET_GRADS is
# "set_grads"): the worker's handlers are exactly these (ops.py checks).
Op = enum.Enum("Op", {k.upper(): k for k in SPEC["ops"]}, type=str)

# psyche's ends of the two pipes: requests arrive on fd 3, answers leave on fd 4.
REQUEST_FD, ANSWER_FD = 3, 4


# The requests, one type an op (the Go side: messages.go). Every request has
# its "op" and its blobs' lengths.
class Request(TypedDict):
    op: str
    blobs: List[int]


class HelloRequest(Request, total=False):
    protocol: int
    device: str
    devices: List[str]
    timeout: float  # seconds: the ranks' collectives time out with the round


class DescribeRequest(Request):
    config: Dict  # {"json": a config.json's text}


class Layout(TypedDict):
    shape: List[int]
    outer: int
    rows: int
    cols: int
    th: int
    tw: int
    k: int


class OpenRequest(Request):
    arch: str  # gpt, llama or transformers
    config: Dict  # the shape (GPT, Llama) or {"json": ...} (transformers)
    seed: Optional[int]  # a transformers model drawn from it; None: the weights follow
    layouts: List[Layout]
    shapes: List[List[int]]
    distro: Dict  # decay, weight_decay, clip, quantize, normalize_rms, max_value
    precision: str
    compile: bool
    placement: str


class BatchRequest(Request):
    b: int  # sequences
    t: int  # tokens a sequence; inputs and targets follow as uint32 blobs


class LRRequest(Request):
    lr: float  # a step's, or an apply's or try's (a round's aggregate follows, three blobs a tensor)


class StatsRequest(Request, total=False):
    reset: bool


class ReadRequest(Request):
    tensor: int  # a parameter tensor, in the order of the open request's shapes
    offset: int  # the first value of the range read
    count: int  # how many values: one float32 blob answers


def say(msg: str) -> None:
    """A line psyche logs."""
    sys.stderr.write(LOG_PREFIX + msg + "\n")
    sys.stderr.flush()


class Refused(Exception):
    """A request the worker answers with an error and survives."""

    def __init__(self, kind: "Kind", msg: str):
        super().__init__(msg)
        self.kind = Kind(kind)


def read_exact(f: BinaryIO, n: int) -> bytearray:
    """n bytes of f, read into one buffer (a blob may be a tensor of
    hundreds of MiB: read in pieces and joined, it would be held two or
    three times over for a moment). Writable, so that a tensor can be made
    on it without a copy (tensors.from_f32)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = f.readinto(view[got:])
        if not k:
            raise EOFError
        got += k
    return buf


def read_message(f: BinaryIO) -> Tuple[Optional[dict], List[bytearray]]:
    """One message; (None, []) when the other end closed between messages."""
    head = f.read(4)
    if not head:
        return None, []
    if len(head) < 4:
        head += read_exact(f, 4 - len(head))
    (n,) = struct.unpack("<I", head)
    h = json.loads(read_exact(f, n))
    blobs = [read_exact(f, int(k)) for k in h.get("blobs", [])]
    return h, blobs


def write_message(f: BinaryIO, h: dict, blobs: Sequence = ()) -> None:
    blobs = [b if isinstance(b, (bytes, bytearray, memoryview)) else bytes(b) for b in blobs]
    h = dict(h)
    h["blobs"] = [len(b) for b in blobs]
    js = json.dumps(h).encode()
    f.write(struct.pack("<I", len(js)))
    f.write(js)
    for b in blobs:
        f.write(b)
    f.flush()


class Answers:
    """The answer pipe, written by one thread at a time: the main loop's
    answers, and a multi-device worker's last word when a rank fails (from
    its watcher thread, unasked if no request is in flight)."""

    def __init__(self, f: BinaryIO):
        self.f = f
        self.lock = threading.RLock()

    def write(self, h: dict, blobs: Sequence = ()) -> None:
        with self.lock:
            write_message(self.f, h, blobs)


def failure(kind: "Kind", msg: str, **fields) -> dict:
    """A failed answer's header."""
    return dict(fields, ok=False, kind=Kind(kind).value, error=msg)


def refuse_start(msg: str, **fields) -> None:
    """Answers psyche's hello with a Kind.MISSING failure and exits: the
    python this runs on cannot run the worker (fields name what it lacks)."""
    try:
        rd = os.fdopen(REQUEST_FD, "rb", buffering=0)
        wr = os.fdopen(ANSWER_FD, "wb")
        read_message(rd)
        write_message(wr, failure(Kind.MISSING, msg, **fields))
    except (OSError, EOFError, ValueError):
        say(msg)
    sys.exit(0)


if __name__ == "__main__":
    json.dump({"version": VERSION, "min_torch": MIN_TORCH, "default_timeout_s": DEFAULT_TIMEOUT_S,
               "log_prefix": LOG_PREFIX, "kinds": sorted(k.value for k in Kind),
               "ops": sorted(o.value for o in Op)}, sys.stdout)
    sys.stdout.write("\n")
