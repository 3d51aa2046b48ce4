"""A worker spread over several devices with torch.distributed.

psyche starts rank 0 (worker.py) and talks to it alone; rank 0 starts one
process per further device (this same worker.py with --rank), and they form
a process group: NCCL on CUDA, gloo on the CPU. No torchrun: the ranks meet
through a FileStore in the worker's own directory (no port to pick or
race for).

Commands reach the other ranks through a pipe each (psyche's own framing,
protocol.py: one message a request, its header psyche's; no timeout: a
worker may wait minutes between rounds); the data a
command needs travels by collectives, which do time out (the process
group's timeout: the round's), so a rank that hangs cannot hold the others
forever.

No rank outlives the worker: the ranks are in rank 0's process group (the
one psyche kills), each asks the kernel to kill it when its parent dies,
and reads EOF on its command pipe when rank 0 is gone. Rank 0 watches its
ranks: one that exits, for any reason, ends the worker at once, telling
psyche which rank, on which device, and how it ended (a failed answer of
kind rank: protocol.py).

Each rank counts the collectives it enters and tells rank 0 (a message on
a pipe of its own, in the protocol's framing); rank 0's watcher hands the
counts to psyche as a progress message whenever they change. When a call
times out, psyche names the ranks that fell behind from the last counts it
heard: a rank that hangs cannot speak, but its count stays low.
"""

import ctypes
import datetime
import os
import signal
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist

from protocol import Kind, failure, read_message, say, write_message

# Rank 0's exit status when a rank stopped or a collective failed.
EXIT_RANK = 4
PR_SET_PDEATHSIG = 1


def how_exited(rc: int) -> str:
    """A child's exit as psyche's Go side words a process's: "exit status
    1", "signal killed"."""
    if rc < 0:
        try:
            name = signal.strsignal(-rc) or str(-rc)
        except (ValueError, AttributeError):
            name = str(-rc)
        return "signal " + name.lower()
    return "exit status %d" % rc


def die_with_parent(parent: int) -> None:
    """Has the kernel kill this process when its parent dies (Linux), and
    exits now if the parent is already gone."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the command pipe's EOF still ends the rank
    if os.getppid() != parent:
        os._exit(EXIT_RANK)


class Group:
    """One rank's view of the worker's ranks."""

    def __init__(self, rank: int, devices, backend: str, timeout: float, directory: str):
        self.rank = rank
        self.devices = [torch.device(d) for d in devices]
        self.world = len(self.devices)
        self.device = self.devices[rank]
        self.backend = backend
        self.timeout = timeout
        self.dir = directory
        self.children = []  # rank 0: the other ranks' processes, rank 1 first
        self.pipes = []  # rank 0: the write end of each one's command pipe
        self.cmd = None  # ranks > 0: the read end of this rank's
        self.report = None  # ranks > 0: where this rank tells rank 0 its count
        self.closing = False
        self.lock = threading.Lock()
        self.answers = None  # rank 0: protocol.Answers, where fail says why
        self.entered = 0  # the collectives this rank has entered
        self.counts = [0] * self.world  # rank 0: every rank's, as each last said
        self.shown = None  # rank 0: the counts psyche last heard

    def name(self, r: int) -> str:
        return "rank %d (%s)" % (r, self.devices[r])

    # -- starting --------------------------------------------------------

    def environment(self) -> dict:
        env = dict(os.environ)
        # gloo's sockets stay on this machine; NCCL turns a timed-out
        # collective into an error (both spellings: torch renamed it).
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        env.setdefault("NCCL_ASYNC_ERROR_HANDLING", "1")
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        return env

    def launch(self, script: str) -> None:
        """Rank 0: starts ranks 1.. and joins the group with them."""
        env = self.environment()
        os.environ.update({k: env[k] for k in ("GLOO_SOCKET_IFNAME", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                               "NCCL_ASYNC_ERROR_HANDLING")})
        for r in range(1, self.world):
            rd, wr = os.pipe()
            hear, told = os.pipe()
            args = [sys.executable, "-u", script, "--rank", str(r), "--devices", ",".join(str(d) for d in self.devices),
                    "--backend", self.backend, "--timeout", repr(self.timeout), "--cmd-fd", str(rd),
                    "--report-fd", str(told), "--parent", str(os.getpid())]
            # Same process group as rank 0 (no new session): psyche's kill
            # of the group reaches every rank.
            p = subprocess.Popen(args, pass_fds=(rd, told), env=env, stdin=subprocess.DEVNULL)
            os.close(rd)
            os.close(told)
            self.children.append(p)
            self.pipes.append(os.fdopen(wr, "wb"))
            threading.Thread(target=self._hear, args=(r, os.fdopen(hear, "rb")), daemon=True).start()
        threading.Thread(target=self._watch, daemon=True).start()
        self._init()

    def join(self, cmd_fd: int, report_fd: int) -> None:
        """Ranks > 0: joins the group rank 0 started."""
        self.cmd = os.fdopen(cmd_fd, "rb")
        self.report = os.fdopen(report_fd, "wb")
        self._init()

    def _init(self) -> None:
        store = dist.FileStore(os.path.join(self.dir, "store"), self.world)
        dist.init_process_group(self.backend, store=store, rank=self.rank, world_size=self.world,
                                timeout=datetime.timedelta(seconds=self.timeout))
        # Collectives on CUDA tensors go through NCCL; the few on host
        # values (the loss, a status) through a gloo group.
        self.host = dist.new_group(backend="gloo") if self.backend == "nccl" else None

    def pids(self):
        return [os.getpid()] + [p.pid for p in self.children]

    # -- failure ---------------------------------------------------------

    def _watch(self) -> None:
        while True:
            time.sleep(0.1)
            for r, p in enumerate(self.children, start=1):
                rc = p.poll()
                if rc is not None and not self.closing:
                    self.fail("%s stopped: %s" % (self.name(r), how_exited(rc)))
            self._show_progress()

    def _hear(self, r: int, f) -> None:
        """Rank 0: takes rank r's counts until its pipe ends."""
        while True:
            try:
                m, _ = read_message(f)
            except (EOFError, OSError, ValueError):
                return
            if m is None:
                return
            self.counts[r] = int(m["entered"])

    def _show_progress(self) -> None:
        """Rank 0: tells psyche the ranks' counts when they changed. Counts
        move only while a request is in flight (the ranks enter collectives
        for requests alone), so psyche, which reads during requests, finds
        at most the last of them still unread at the next one."""
        counts = list(self.counts)
        counts[0] = self.entered
        if counts == self.shown or self.answers is None:
            return
        self.shown = counts
        try:
            self.answers.write({"progress": counts})
        except OSError:
            pass  # psyche is gone

    def fail(self, why: str) -> None:
        """Rank 0: ends the worker, every rank of it, saying why: to psyche,
        as a failed answer of kind rank (the answer to the request in
        flight, or the last message psyche reads), and in its log."""
        with self.lock:
            say(why)
            if self.answers is not None:
                try:
                    self.answers.write(failure(Kind.RANK, why))
                except OSError:
                    pass  # psyche is gone
            for p in self.children:
                if p.poll() is None:
                    p.kill()
            os._exit(EXIT_RANK)

    def failed(self, exc: BaseException) -> None:
        """Rank 0: a collective failed (a peer is gone or timed out). A rank
        that stopped is the reason to report: its exit shows within moments
        of the broken connection."""
        for _ in range(50):
            for r, p in enumerate(self.children, start=1):
                rc = p.poll()
                if rc is not None:
                    self.fail("%s stopped: %s" % (self.name(r), how_exited(rc)))
            time.sleep(0.1)
        self.fail("rank 0 (%s): a collective failed: %s" % (self.device, str(exc).strip().splitlines()[0]))

    # -- commands --------------------------------------------------------

    def send(self, h: dict) -> None:
        """Rank 0: hands a request's header to every other rank: the header
        as psyche sent it (its "blobs" name rank 0's blobs, whose data the
        ranks receive by collectives), inside a message of no blobs."""
        for f in self.pipes:
            try:
                write_message(f, {"forwarded": h})
            except (BrokenPipeError, OSError):
                pass  # the watcher reports the rank that left

    def recv(self):
        """Ranks > 0: the next request's header, or None when rank 0 is gone."""
        try:
            m, _ = read_message(self.cmd)
        except EOFError:
            return None
        return None if m is None else m["forwarded"]

    def close(self) -> None:
        """Rank 0: the others exit at the end of their command pipes."""
        self.closing = True
        for f in self.pipes:
            try:
                f.close()
            except OSError:
                pass
        deadline = time.monotonic() + 10
        for p in self.children:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    # -- collectives -----------------------------------------------------

    def enter(self) -> None:
        self.entered += 1
        if self.report is not None:
            try:
                write_message(self.report, {"entered": self.entered})
            except OSError:
                self.report = None  # rank 0 is gone: this rank ends at its command pipe's end

    def group_of(self, t: torch.Tensor):
        return self.host if (self.host is not None and t.device.type == "cpu") else None

    def broadcast(self, t: torch.Tensor, src: int) -> None:
        self.enter()
        dist.broadcast(t, src, group=self.group_of(t))

    def all_reduce(self, t: torch.Tensor, op=dist.ReduceOp.SUM) -> None:
        self.enter()
        dist.all_reduce(t, op, group=self.group_of(t))

    def all_gather(self, out, t: torch.Tensor) -> None:
        self.enter()
        dist.all_gather(out, t, group=self.group_of(t))

    def all_gather_into(self, out: torch.Tensor, t: torch.Tensor) -> None:
        """Every rank's t, rank order, into out (world times t's size): one
        buffer, one collective."""
        self.enter()
        dist.all_gather_into_tensor(out, t, group=self.group_of(t))
