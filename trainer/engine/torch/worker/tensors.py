"""Bytes to tensors and back, devices, and device memory: what every part of
the worker needs and none of them owns. Blobs are little-endian: tokens and
indices uint32, values and losses float32 (protocol.py)."""

import sys
from typing import List, Sequence, Union

import numpy as np
import torch

from protocol import Kind, Refused


def f32_bytes(t: torch.Tensor) -> Union[bytes, memoryview]:
    """t's values as little-endian float32 bytes, for an answer. A float32
    tensor in CPU memory, contiguous, is answered from its own memory (no
    copy: a parameter read whole would otherwise be held twice while it is
    written); the answer is written before anything changes it."""
    t = t.detach()
    if t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() and sys.byteorder == "little":
        return memoryview(t.reshape(-1).view(torch.uint8).numpy())
    return t.to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False).tobytes()


def u32_bytes(t: torch.Tensor) -> bytes:
    # int32 and uint32 share their bytes for indices below 2^31 (a tile
    # has at most 2^31 coefficients).
    return t.detach().to("cpu", torch.int32).contiguous().numpy().astype("<i4", copy=False).tobytes()


def from_f32(b: Union[bytes, bytearray], shape: Sequence[int]) -> torch.Tensor:
    """A float32 tensor of shape holding blob b (on the CPU): b's own
    memory when it is writable (a bytearray, as protocol.read_message
    reads them) and little-endian, else a copy."""
    a = np.frombuffer(b, dtype="<f4").astype(np.float32, copy=False)
    if not a.flags.writeable:
        a = a.copy()
    return torch.from_numpy(a).view(*shape)


def from_u32(b: bytes) -> torch.Tensor:
    """A flat int64 tensor of blob b's uint32 values (on the CPU)."""
    return torch.from_numpy(np.frombuffer(b, dtype="<u4").astype(np.int64))


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    msg = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg)


def resolve_device(dev: str) -> torch.device:
    """The torch device dev names, checked against this machine."""
    d = torch.device(dev)
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise Refused(Kind.INPUT, "device %s: this torch (%s) sees no CUDA device" % (dev, torch.__version__))
        idx = d.index if d.index is not None else torch.cuda.current_device()
        if idx >= torch.cuda.device_count():
            raise Refused(Kind.INPUT, "device %s: this machine has %d CUDA devices" % (dev, torch.cuda.device_count()))
        return torch.device("cuda", idx)
    if d.type == "mps":
        if not torch.backends.mps.is_available():
            raise Refused(Kind.INPUT, "device mps: this torch (%s) has no usable mps backend" % torch.__version__)
    return d


def resolve_devices(devs: Sequence[str]) -> List[torch.device]:
    """The devices of a worker: "all" is every CUDA device torch sees."""
    if list(devs) == ["all"]:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise Refused(Kind.INPUT, "devices all: this torch (%s) sees no CUDA device" % torch.__version__)
        return [torch.device("cuda", i) for i in range(n)]
    out = [resolve_device(d) for d in devs]
    if len(out) > 1:
        if len({d.type for d in out}) > 1 or out[0].type not in ("cpu", "cuda"):
            raise Refused(Kind.INPUT, "devices %s: several devices must all be cpu or all cuda:N" % ",".join(devs))
        if out[0].type == "cuda" and len(set(out)) != len(out):
            raise Refused(Kind.INPUT, "devices %s: a CUDA device is named twice" % ",".join(devs))
    return out


def cpu_threads(world: int) -> None:
    """Ranks sharing a machine's cores split them (each would take all)."""
    if world > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // world))


def allocated(device: torch.device) -> int:
    """Bytes torch holds allocated on device (0 on the CPU, where it does not
    count)."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    return 0
