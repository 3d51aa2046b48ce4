"""A witness's undo: the parameters as they were before a try, kept in an
unlinked file rather than as a second copy beside the model.

A try applies one result's aggregate to the model and the undo after it
puts back the exact bits the try replaced. Kept as tensors, those bits are
a whole copy of the parameters, the fourth after the parameters, their
gradient and DisTrO's momentum: at 0.5B parameters on a CPU trainer, 1.8 GiB
of a 9 to 11 GiB worker, and on an accelerator a quarter of the model's
memory. In a file they are the page cache's: the kernel keeps them in
memory while memory is free and writes them out when it is not, and a
crash frees them with the process. A device's tensors pass through one
bounded host buffer on their way.

Where the file cannot be written (a full or read-only temporary folder),
the copy is kept in memory as before, and the worker says so once.
"""

import tempfile
from typing import BinaryIO, Callable, List, Optional

import torch

from protocol import say

# The most bytes a device's tensor moves through host memory at once.
STAGE_BYTES = 64 << 20


class Undo:
    """What a try saved, to be put back by an undo.

    keep saves the parameters unless the file already holds them as they
    are (an undo leaves the model as the file holds it, so a witness's
    second try in a round writes nothing); changed says the parameters
    moved on (an apply, a new model), so the next keep writes again.
    """

    def __init__(self) -> None:
        self.file: Optional[BinaryIO] = None
        self.mem: Optional[List[torch.Tensor]] = None  # where the file could not be written
        self.stage: Optional[torch.Tensor] = None
        self.fresh = False  # whether what is kept equals the parameters now
        self.kept = False

    def changed(self) -> None:
        self.fresh = False

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        self.file, self.mem, self.stage, self.fresh, self.kept = None, None, None, False, False

    def keep(self, tensors: List[torch.Tensor]) -> None:
        if self.fresh:
            return
        if self.mem is None:
            try:
                if self.file is None:
                    # Unlinked on creation where the system allows it
                    # (O_TMPFILE): nothing is left behind by a crash.
                    self.file = tempfile.TemporaryFile(prefix="psyche-undo-", buffering=0)
                self.file.seek(0)
                with torch.no_grad():
                    for t in tensors:
                        self.write(t)
            except OSError as exc:
                say("the undo file could not be written (%s): a try's undo is kept in memory" % exc)
                if self.file is not None:
                    self.file.close()
                self.file = None
                self.mem = []
        if self.mem is not None:
            with torch.no_grad():
                if len(self.mem) == len(tensors):
                    for s, t in zip(self.mem, tensors):
                        s.copy_(t)
                else:
                    self.mem = [t.clone() for t in tensors]
        self.fresh, self.kept = True, True

    def restore(self, tensors: List[torch.Tensor]) -> None:
        if not self.kept:
            raise RuntimeError("undo: nothing kept")
        with torch.no_grad():
            if self.mem is not None:
                for s, t in zip(self.mem, tensors):
                    t.copy_(s)
            else:
                assert self.file is not None
                self.file.seek(0)
                for t in tensors:
                    self.read(t)
        self.fresh = True

    # -- moving bytes --------------------------------------------------------

    def write(self, t: torch.Tensor) -> None:
        if t.device.type == "cpu" and t.is_contiguous():
            write_all(self.file, bytes_of(t))
            return
        flat = t.reshape(-1) if t.is_contiguous() else t.contiguous().reshape(-1)
        raw = flat.view(torch.uint8)
        stage = self.staging()
        for off in range(0, raw.numel(), STAGE_BYTES):
            part = raw[off:off + STAGE_BYTES]
            buf = stage[:part.numel()]
            buf.copy_(part)
            write_all(self.file, bytes_of(buf))

    def read(self, t: torch.Tensor) -> None:
        if t.device.type == "cpu" and t.is_contiguous():
            read_all(self.file, bytes_of(t))
            return
        whole = t if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)
        raw = whole.reshape(-1).view(torch.uint8)
        stage = self.staging()
        for off in range(0, raw.numel(), STAGE_BYTES):
            part = raw[off:off + STAGE_BYTES]
            buf = stage[:part.numel()]
            read_all(self.file, bytes_of(buf))
            part.copy_(buf)
        if whole is not t:
            t.copy_(whole)

    def staging(self) -> torch.Tensor:
        if self.stage is None:
            self.stage = torch.empty(STAGE_BYTES, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        return self.stage


def bytes_of(t: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's bytes, shared with it (any dtype: numpy
    has no bfloat16, so they are seen as bytes)."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def write_all(f: BinaryIO, b: memoryview) -> None:
    whole(f.write, b, "undo: the file took no bytes")


def read_all(f: BinaryIO, b: memoryview) -> None:
    whole(f.readinto, b, "undo: the file ended early")


def whole(move: Callable[[memoryview], Optional[int]], b: memoryview, stuck: str) -> None:
    """Moves all of b by move (a write or a readinto of a file), which may
    move less than asked: one call moves at most about 2 GiB on Linux, and a
    tensor may be larger."""
    while len(b):
        n = move(b)
        if not n:
            raise OSError(stuck)
        b = b[n:]
