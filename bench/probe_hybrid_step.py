"""Probe (issue 21): where one hybrid MoE layer's time goes at decode batch 32 on the H200 machine.

Qwen3-MoE experts (128, hidden 2048, width 768, top-8, bf16). One JSON line per measurement:

- ``kernel``: the host's kernels (runtime.expert_math.host_rows: grouped, padded; the first run's rows also have a
  dense pass, since removed) over a part of n experts at 1-64 tokens, alone and while GPU kernels read 2 GiB of
  pinned memory through UVA (``busy``);
- ``matmul``: the bare matmuls of the dense pass at 32 tokens, down in either layout;
- ``wait_value``: whether a stream can wait on a 32-bit flag in pinned host memory (cuStreamWaitValue32, through
  ctypes) that a host thread sets, and what the host thread wrote is then read right;

Its ``layer`` part (one layer's SplitForward and the time of its phases, docs/BENCHMARKS.md 2026-12-01) was removed
on 2026-12-03: it built a SplitForward several versions old. A split layer's host and GPU times in a forward are now
in bench/bench_moe_hybrid.py's rows (``host_ms_per_layer``) and in the host guard's marks (runtime/host_guard.py).

    PYTHONPATH=. python bench/probe_hybrid_step.py --out $OUT/probe.jsonl
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from runtime import cpu_experts  # noqa: E402
from runtime.expert_math import Layout, host_rows, rows_dtype  # noqa: E402
from runtime.timing import wall_ms  # noqa: E402
from runtime.uva import device_view  # noqa: E402

E, H, I, K = 128, 2048, 768, 8
OUT = None


def emit(**row):
    line = json.dumps(row)
    print(line, flush=True)
    if OUT is not None:
        OUT.write(line + "\n")
        OUT.flush()


class Stub(nn.Module):
    def __init__(self):
        super().__init__()
        self.act_fn = nn.SiLU()

    def _apply_gate(self, a):
        g, u = a.chunk(2, dim=-1)
        return self.act_fn(g) * u


def wall(fn, reps=7):
    return wall_ms(fn, reps)


def routing(tokens, g):
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(tokens)])
    w = torch.softmax(torch.randn(tokens, K, generator=g), -1).to(torch.bfloat16)
    return idx, w


class Busy:
    """GPU kernels reading 2 GiB of pinned host memory through UVA, in a loop, until stopped."""

    def __init__(self, dev):
        self.host = torch.full((2**30 // 8192, 8192), 0.001, dtype=torch.bfloat16).pin_memory()
        self.view = device_view(self.host, dev)
        self.x = torch.randn(1, 8192, dtype=torch.bfloat16, device=dev)

    def run(self, fn, passes=6):
        torch.cuda.synchronize()
        start, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(passes):
            self.x @ self.view.T
        done.record()
        times = []
        while not done.query():
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        gbps = passes * self.host.nbytes / (start.elapsed_time(done) / 1e3) / 1e9
        return (statistics.median(times) if times else None), len(times), gbps


def kernels(dev, busy):
    g = torch.Generator().manual_seed(0)
    stub = Stub()
    for n in (48, 64):
        gu = (torch.randn(n, 2 * I, H, generator=g) / 40).to(torch.bfloat16)
        dn = (torch.randn(n, I, H, generator=g) / 40).to(torch.bfloat16)  # the host's layout until 2026-12-03, [n, I, H]
        w = {"gate_up_proj": gu, "down_proj": dn}
        layout = Layout("gate_up_proj", True, False, False, True, False)
        table = torch.full((E,), n, dtype=torch.long)
        table[:n] = torch.arange(n)
        per = 3 * I * H * 2
        for tokens in (1, 8, 32, 64):
            idx, rw = routing(tokens, g)
            hid = torch.randn(tokens, H, generator=g).to(torch.bfloat16)
            touched = int(torch.unique(idx[idx < n]).numel())
            ref = None
            for kernel in ("grouped", "padded"):
                out = torch.zeros(tokens * K, H, dtype=rows_dtype(hid, rw))

                def call(kernel=kernel, out=out):
                    out.zero_()
                    host_rows(stub, layout, w, table, hid, idx, rw, out, kernel=kernel)

                ms = wall(call)
                summed = out.view(tokens, K, H).float().sum(1)
                ref = summed if ref is None else ref
                row = dict(what="kernel", n=n, tokens=tokens, touched=touched, kernel=kernel, ms=round(ms, 3),
                           touched_gbps=round(touched * per / ms / 1e6, 1), all_gbps=round(n * per / ms / 1e6, 1),
                           max_diff_vs_grouped=round((summed - ref).abs().max().item(), 4),
                           threads=torch.get_num_threads())
                if busy is not None and tokens in (8, 32):
                    b_ms, count, gbps = busy.run(call)
                    row |= dict(busy_ms=round(b_ms, 3) if b_ms else None, busy_calls=count, uva_gbps_busy=round(gbps, 1))
                emit(**row)
        if n == 48:
            x = torch.randn(32, H).to(torch.bfloat16)
            a = torch.randn(32, n * I).to(torch.bfloat16)
            dn_t = dn.permute(2, 0, 1).reshape(H, n * I).contiguous()  # [H, n*I]
            for name, fn, nbytes in (("gate_up x@W.T", lambda: x @ gu.view(-1, H).T, gu.nbytes),
                                     ("down a@W [nI,H]", lambda: a @ dn.view(-1, H), dn.nbytes),
                                     ("down a@W.T [H,nI]", lambda: a @ dn_t.T, dn.nbytes)):
                ms = wall(fn)
                emit(what="matmul", n=n, tokens=32, op=name, ms=round(ms, 3), gbps=round(nbytes / ms / 1e6, 1))
            for threads in (15, 12, 8):
                torch.set_num_threads(threads)
                idx, rw = routing(32, g)
                hid = torch.randn(32, H, generator=g).to(torch.bfloat16)
                out = torch.zeros(32 * K, H, dtype=torch.bfloat16)
                for kernel in ("padded",):
                    ms = wall(lambda: host_rows(stub, layout, w, table, hid, idx, rw, out, kernel=kernel))
                    emit(what="kernel_threads", n=n, tokens=32, kernel=kernel, threads=threads, ms=round(ms, 3))
            torch.set_num_threads(THREADS)


def wait_value(dev):
    row = dict(what="wait_value")
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        name = "cuStreamWaitValue32_v2" if hasattr(lib, "cuStreamWaitValue32_v2") else "cuStreamWaitValue32"
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        fn.restype = ctypes.c_int
        row["symbol"] = name
        flag = torch.zeros(1, dtype=torch.int32).pin_memory()
        stream = torch.cuda.current_stream(dev)
        data = torch.zeros(4096, dtype=torch.float32).pin_memory()
        src = torch.randn(4096)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        e0.record()
        rc = fn(ctypes.c_void_p(stream.cuda_stream), ctypes.c_uint64(flag.data_ptr()), 1, 0)  # GEQ
        row["rc"] = rc
        if rc != 0:
            emit(**row)
            return False
        got = data.to(dev, non_blocking=True)
        e1.record()

        def setter():
            time.sleep(0.05)
            data.copy_(src)
            flag[0] = 1

        t = threading.Thread(target=setter)
        t.start()
        t.join()
        deadline = time.perf_counter() + 3.0
        while not e1.query():
            if time.perf_counter() > deadline:  # the stream never saw the flag: it stays blocked
                row["hung"] = True
                emit(**row)
                return False
        row["waited_ms"] = round(e0.elapsed_time(e1), 2)
        row["data_right"] = bool(torch.equal(got.cpu(), src))
        # round trips: a host thread answers each of 200 waits, the GPU runs a tiny kernel between
        flag.zero_()
        y = torch.zeros(1, device=dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(1, 201):
            fn(ctypes.c_void_p(stream.cuda_stream), ctypes.c_uint64(flag.data_ptr()), i, 0)
            y += 1
        done = torch.cuda.Event()
        done.record()

        def answer():
            for i in range(1, 201):
                flag[0] = i
                time.sleep(0.0005)

        t = threading.Thread(target=answer)
        t.start()
        t.join()
        done.synchronize()
        row["round_trips_200_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
        row["y_right"] = y.item() == 200
    except Exception as exc:  # noqa: BLE001
        row["error"] = repr(exc)
    emit(**row)
    return True


THREADS = 16


def main():
    global OUT, THREADS
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    OUT = open(args.out, "w")
    THREADS = cpu_experts.host_threads()
    torch.set_num_threads(THREADS)
    dev = torch.device("cuda")
    emit(what="host", threads=THREADS, torch=torch.__version__, device=torch.cuda.get_device_name(dev))
    t0 = time.perf_counter()
    busy = Busy(dev)
    kernels(dev, busy)
    del busy
    wait_value(dev)  # last: a stream that never sees its flag stays blocked
    emit(what="total", s=round(time.perf_counter() - t0, 1))
    OUT.close()
    os._exit(0)


if __name__ == "__main__":
    main()
