"""The worker's answers to psyche's requests, one handler an op.

A handler takes the request's header and blobs (None on a rank other than
0: rank 0 hands the data on by collectives) and returns the answer's
fields and blobs, or raises protocol.Refused. The handlers keep the
protocol's state (a gradient kept for step, parameters saved by try for
undo) and leave everything about devices and ranks to the model's
placement (placement.py).
"""

import hashlib
import math
import os
import sys
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

import placement
import protocol
import registry
from protocol import (BatchRequest, DescribeRequest, HelloRequest, Kind, LRRequest, Op, OpenRequest, ReadRequest,
                      Refused, Request, StatsRequest, say)
from tensors import allocated, cpu_threads, f32_bytes, resolve_devices
from undo import Undo

Answer = Tuple[Dict, List[bytes]]
Handler = Callable[[Dict, Optional[List[bytes]]], Answer]


class Worker:
    def __init__(self, device: torch.device = torch.device("cpu"), g=None,
                 answers: Optional[protocol.Answers] = None) -> None:
        self.device = device
        self.g = g  # ranks.Group of a multi-device worker
        self.answers = answers  # rank 0: where a rank's failure is said
        self.place: Optional[placement.Single] = None  # the open model, as placed
        self.before_try = Undo()  # what try saved (this rank's part of the parameters)
        self.trying = False
        self.has_grad = False
        self.timeout = protocol.DEFAULT_TIMEOUT_S

    @property
    def rank(self) -> int:
        return self.g.rank if self.g is not None else 0

    def forwarded(self, op: str) -> bool:
        """Whether the other ranks take part in op (with no model open, only
        open itself)."""
        if self.g is None or op in (Op.HELLO, Op.DESCRIBE, Op.STATS):
            return False
        if self.place is None:
            return op == Op.OPEN
        return op == Op.OPEN or self.place.forwards(op)

    def handlers(self) -> Dict[str, Handler]:
        """The handler of each of protocol.json's ops, by the op's name."""
        hs = {Op.HELLO: self.hello, Op.DESCRIBE: self.describe, Op.OPEN: self.open, Op.GRADIENT: self.gradient,
              Op.LOSSES: self.losses, Op.STEP: self.step, Op.APPLY: self.apply, Op.TRY: self.try_, Op.UNDO: self.undo,
              Op.PARAMS: self.params, Op.READ: self.read, Op.GRADS: self.grads, Op.SET_GRADS: self.set_grads,
              Op.STATS: self.stats, Op.DIGESTS: self.digests}
        unhandled = [o.value for o in Op if o not in hs]
        if unhandled:
            raise RuntimeError("protocol.json declares ops no handler answers: %s" % ", ".join(unhandled))
        return {o.value: fn for o, fn in hs.items()}

    def need_model(self) -> placement.Single:
        if self.place is None or self.place.model is None:
            raise Refused(Kind.INPUT, "no model is open")
        return self.place

    # -- the worker ----------------------------------------------------------

    def hello(self, h: HelloRequest, blobs: Optional[List[bytes]]) -> Answer:
        devs = h.get("devices") or [h.get("device", "cpu")]
        devices = resolve_devices(devs)
        self.device = devices[0]
        self.timeout = float(h.get("timeout") or protocol.DEFAULT_TIMEOUT_S)
        names, memory, bf16 = [], [], True
        for d in devices:
            if d.type == "cuda":
                props = torch.cuda.get_device_properties(d.index)
                names.append(props.name)
                memory.append(int(props.total_memory))
                bf16 = bf16 and torch.cuda.is_bf16_supported()
            else:
                names.append("")
                memory.append(0)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if len(devices) > 1:
            import ranks  # noqa: E402  (only a multi-device worker needs torch.distributed)
            cpu_threads(len(devices))
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            here = os.path.dirname(os.path.abspath(__file__))
            self.g = ranks.Group(0, devices, backend, max(self.timeout, 60.0), here)
            self.g.answers = self.answers
            self.g.launch(os.path.join(here, "worker.py"))
            say("%d ranks on %s (%s)" % (len(devices), ",".join(str(d) for d in devices), backend))
        return {
            "protocol": protocol.VERSION,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "python": sys.version.split()[0],
            "device": ",".join(str(d) for d in devices),
            "devices": [str(d) for d in devices],
            "device_name": names[0],
            "memory": min(memory),
            "pids": self.g.pids() if self.g is not None else [os.getpid()],
            # Every torch the worker accepts has both (the fields stay for
            # psyche's Info).
            "sdpa": True,
            "compile": True,
            "bf16": bf16,
        }, []

    def describe(self, h: DescribeRequest, blobs: Optional[List[bytes]]) -> Answer:
        names, shapes = registry.describe(h["config"])
        return {"names": names, "shapes": shapes}, []

    def stats(self, h: StatsRequest, blobs: Optional[List[bytes]]) -> Answer:
        """Device memory: allocated now and at its peak since the last stats."""
        out = {"memory": allocated(self.device), "peak": 0}
        if self.device.type == "cuda":
            out["peak"] = int(torch.cuda.max_memory_allocated(self.device))
            if h.get("reset"):
                torch.cuda.reset_peak_memory_stats(self.device)
        return out, []

    # -- the model -------------------------------------------------------------

    def open(self, h: OpenRequest, blobs: Optional[List[bytes]]) -> Answer:
        self.place = None
        place = placement.choose(self.device, self.g, h)
        place.shapes = [list(s) for s in h["shapes"]]
        model = place.build(h)
        nblobs = len(h.get("blobs", []))
        drawn = h.get("seed") is not None and nblobs == 0  # the model drew its weights from the seed
        if len(model.tensors) != len(place.shapes) or (not drawn and nblobs != len(model.tensors)):
            raise Refused(Kind.INPUT, "the model has %d tensors; psyche sent %d shapes and %d tensors"
                          % (len(model.tensors), len(place.shapes), nblobs))
        for i, p in enumerate(model.tensors):
            if list(p.shape) != place.shapes[i]:
                raise Refused(Kind.INPUT, "tensor %d has shape %s here, %s in psyche" % (i, list(p.shape), place.shapes[i]))
        tensors = place.place(model)
        place.load(tensors, None if drawn else blobs, drawn)
        place.amp = torch.bfloat16 if h.get("precision") == "bf16" else None
        place.demo = place.optimizer(h["layouts"], h["distro"])
        self.before_try.close()
        self.trying, self.has_grad = False, False
        compiled = bool(h.get("compile")) and place.compile()
        params = sum(p.numel() for p in tensors)
        mem = place.memory()
        if self.rank == 0:
            say("model of %d parameters on %s (%s%s)%s" % (
                params, place.describe(), "bf16 autocast" if place.amp is not None else "fp32",
                ", compiled" if compiled else "", ", %.2f GiB allocated" % (mem / 2**30) if mem else ""))
        place.log_memory()
        self.place = place
        return {"params": params, "memory": mem, "placement": place.name}, []

    def params(self, h: Request, blobs: Optional[List[bytes]]) -> Answer:
        place = self.need_model()
        return {}, [f32_bytes(p) for p in place.whole_tensors()]

    def read(self, h: ReadRequest, blobs: Optional[List[bytes]]) -> Answer:
        """A range of one parameter tensor's values: what psyche hashes,
        saves and offers the model from, a piece at a time, so that it
        never holds a copy of the whole model."""
        place = self.need_model()
        i, off, n = int(h["tensor"]), int(h["offset"]), int(h["count"])
        if not 0 <= i < len(place.shapes):
            raise Refused(Kind.INPUT, "tensor %d of %d" % (i, len(place.shapes)))
        size = math.prod(place.shapes[i])
        if off < 0 or n < 0 or off + n > size:
            raise Refused(Kind.INPUT, "values [%d, %d) of a tensor of %d" % (off, off + n, size))
        whole = place.whole_tensor(i)
        return {}, [f32_bytes(whole.reshape(-1)[off:off + n])]

    def digests(self, h: Request, blobs: Optional[List[bytes]]) -> Answer:
        """Every rank's digest of its parameters (tests: the ranks must
        hold the same weights, bit for bit; sharded ranks hash the tensors
        gathered from their shards)."""
        place = self.need_model()
        d = hashlib.sha256()
        for p in place.whole_tensors():
            d.update(f32_bytes(p))
        mine = torch.tensor(list(d.digest()), dtype=torch.uint8)
        return {"digests": [bytes(o.tolist()).hex() for o in place.all_ranks(mine)]}, []

    # -- a round -----------------------------------------------------------------

    def gradient(self, h: BatchRequest, blobs: Optional[List[bytes]]) -> Answer:
        place = self.need_model()
        x, y = place.batch(h, blobs)
        place.drop_grads()
        self.has_grad = False
        loss, seq = place.gradient(x, y)
        self.has_grad = True
        return {"loss": loss}, [f32_bytes(seq)]

    def losses(self, h: BatchRequest, blobs: Optional[List[bytes]]) -> Answer:
        place = self.need_model()
        x, y = place.batch(h, blobs)
        loss, seq = place.losses(x, y)
        return {"loss": loss}, [f32_bytes(seq)]

    def step(self, h: LRRequest, blobs: Optional[List[bytes]]) -> Answer:
        place = self.need_model()
        if not self.has_grad:
            raise Refused(Kind.INPUT, "step without a gradient")
        return {}, place.step(float(h["lr"]))

    def apply(self, h: LRRequest, blobs: Optional[List[bytes]]) -> Answer:
        place = self.need_model()
        self.before_try.changed()
        place.apply(place.combined(h, blobs), float(h["lr"]))
        return {}, []

    def try_(self, h: LRRequest, blobs: Optional[List[bytes]]) -> Answer:
        place = self.need_model()
        comb = place.combined(h, blobs)
        self.before_try.keep(place.locals())
        self.trying = True
        place.apply(comb, float(h["lr"]))
        return {}, []

    def undo(self, h: Request, blobs: Optional[List[bytes]]) -> Answer:
        place = self.need_model()
        if not self.trying:
            raise Refused(Kind.INPUT, "undo without a try")
        self.before_try.restore(place.locals())
        self.trying = False
        return {}, []

    # -- for tests ---------------------------------------------------------------

    def grads(self, h: Request, blobs: Optional[List[bytes]]) -> Answer:
        place = self.need_model()
        if not self.has_grad:
            raise Refused(Kind.INPUT, "no gradient")
        return {}, place.grads()

    def set_grads(self, h: Request, blobs: Optional[List[bytes]]) -> Answer:
        """Replaces the kept gradient (tests feed both engines one gradient)."""
        place = self.need_model()
        lens = h.get("blobs", [])
        if len(lens) != len(place.shapes):
            raise Refused(Kind.INPUT, "%d gradients for %d tensors" % (len(lens), len(place.shapes)))
        for s, n in zip(place.shapes, lens):
            if n != 4 * math.prod(s):
                raise Refused(Kind.INPUT, "a gradient of %d bytes for a tensor of %d values" % (n, math.prod(s)))
        place.set_grads(blobs)
        self.has_grad = True
        return {}, []
