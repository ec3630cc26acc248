"""Probe: the host CPU's routed-expert kernels on the H200 host (torch only), to choose the cpu backend's kernel.

Qwen3-MoE expert shape (128 experts, hidden 2048, expert width 768, top-8, bf16). For each token count:
per-expert F.linear loop, F.grouped_mm over the routed pairs, and a dense pass over every expert (all tokens
through all experts, masked by the routing); then the CPU's dense pass while a GPU kernel reads pinned host
memory through UVA (do the two share the host's memory bandwidth?). One JSON line per measurement.
"""
import json, os, sys, time
import torch
import torch.nn.functional as F

E, I, H, K = 128, 768, 2048, 8


def emit(**row):
    print(json.dumps(row), flush=True)


def routing(T, E, K, g):
    return torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])


def loop(x, gu, dn, idx, w):
    out = torch.zeros_like(x)
    ids = idx.reshape(-1)
    order = torch.argsort(ids, stable=True)
    tok = order // idx.shape[1]
    counts = torch.bincount(ids, minlength=gu.shape[0]).tolist()
    s = 0
    ws = w.reshape(-1)
    for e, c in enumerate(counts):
        if c:
            t = tok[s:s + c]
            a = F.linear(x[t], gu[e])
            g, u = a.chunk(2, -1)
            a = F.linear(F.silu(g) * u, dn[e]) * ws[order[s:s + c], None]
            out.index_add_(0, t, a)
            s += c
    return out


def grouped(x, gu, dn, idx, w):
    k = idx.shape[1]
    ids = idx.reshape(-1)
    order = torch.argsort(ids, stable=True)
    tok = order // k
    offs = torch.cumsum(torch.bincount(ids, minlength=gu.shape[0]), 0).to(torch.int32)
    a = F.grouped_mm(x[tok], gu.transpose(1, 2), offs=offs)
    g, u = a.chunk(2, -1)
    o = F.grouped_mm(F.silu(g) * u, dn.transpose(1, 2), offs=offs) * w.reshape(-1)[order, None]
    out = torch.zeros_like(x)
    out.index_add_(0, tok, o)
    return out


def dense(x, gu, dn, idx, w):
    n = gu.shape[0]
    T = x.shape[0]
    a = (x @ gu.view(-1, H).T).view(T, n, -1)
    g, u = a.chunk(2, -1)
    dw = torch.zeros(T, n, dtype=x.dtype)
    dw.scatter_(1, idx, w)
    a = (F.silu(g) * u * dw[..., None]).transpose(0, 1)
    return torch.bmm(a, dn.transpose(1, 2)).sum(0, dtype=torch.float32).to(x.dtype)


def timed(f, *a, reps=5):
    f(*a)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f(*a)
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2] * 1e3


def main():
    g = torch.Generator().manual_seed(0)
    cores = len(os.sched_getaffinity(0))
    gu = (torch.randn(E, 2 * I, H, generator=g) / 40).to(torch.bfloat16)
    dn = (torch.randn(E, H, I, generator=g) / 40).to(torch.bfloat16)
    per_expert = (gu[0].numel() + dn[0].numel()) * 2
    emit(what="host", cores=cores, torch=torch.__version__, threads=torch.get_num_threads())
    for threads in sorted({cores, max(1, cores // 2)}, reverse=True):
        torch.set_num_threads(threads)
        for T in (1, 8, 32, 128, 2048):
            x = (torch.randn(T, H, generator=g)).to(torch.bfloat16)
            idx = routing(T, E, K, g)
            w = torch.rand(T, K, generator=g).to(torch.bfloat16)
            hit = int(torch.unique(idx).numel())
            for name, f in (("loop", loop), ("grouped", grouped), ("dense", dense)):
                if name == "dense" and T > 128:
                    continue
                if name == "loop" and T > 128 and threads != cores:
                    continue
                try:
                    ms = timed(f, x, gu, dn, idx, w, reps=3 if T >= 2048 else 5)
                except Exception as exc:  # noqa: BLE001
                    emit(what="kernel", kernel=name, tokens=T, error=str(exc)[:200])
                    continue
                read = hit * per_expert if name != "dense" else E * per_expert
                emit(what="kernel", kernel=name, threads=threads, tokens=T, experts_hit=hit, ms=round(ms, 3),
                     weights_gbps=round(read / ms / 1e6, 1))
            ref = loop(x, gu, dn, idx, w).float()
            for name, f in (("grouped", grouped), ("dense", dense)):
                if name == "dense" and T > 128:
                    continue
                d = (f(x, gu, dn, idx, w).float() - ref).abs().max().item()
                emit(what="agree", kernel=name, tokens=T, max_abs_vs_loop=d, ref_max=ref.abs().max().item())
    torch.set_num_threads(cores)
    if not torch.cuda.is_available():
        return
    # D2H + sync round trip of a small tensor, and H2D back
    dev = torch.device("cuda")
    h = torch.randn(32, H, device=dev, dtype=torch.bfloat16)
    pinned = torch.empty(32, H, dtype=torch.bfloat16).pin_memory()
    ts = []
    for _ in range(50):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        pinned.copy_(h, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        h.copy_(pinned, non_blocking=True)
        ts.append(time.perf_counter() - t0)
    ts.sort()
    emit(what="roundtrip_us", tokens=32, us=round(ts[25] * 1e6, 1))
    # concurrency: GPU reads 4 GiB pinned through UVA (a 1-token matmul) while the CPU runs dense passes
    nbytes = 4 << 30
    host = torch.empty(nbytes // 2, dtype=torch.bfloat16).pin_memory()
    host.view(-1, 8192)[:] = 0.001

    class Arr:
        def __init__(s, t):
            s._t = t
            s.__cuda_array_interface__ = {"shape": (t.numel(),), "typestr": "<u2", "data": (t.data_ptr(), False),
                                          "version": 3, "strides": None}
    view = torch.as_tensor(Arr(host), device=dev).view(torch.bfloat16).view(-1, 8192)
    xv = torch.randn(1, 8192, device=dev, dtype=torch.bfloat16)

    def uva_once():
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        (xv @ view.T).sum()
        e.record()
        return s, e
    s, e = uva_once(); torch.cuda.synchronize()
    s, e = uva_once(); torch.cuda.synchronize()
    alone_uva = s.elapsed_time(e)
    x = torch.randn(32, H).to(torch.bfloat16)
    idx = routing(32, E, K, g)
    w = torch.rand(32, K, generator=g).to(torch.bfloat16)
    alone_cpu = timed(dense, x, gu, dn, idx, w)
    torch.cuda.synchronize()
    evs = [uva_once() for _ in range(3)]
    t0 = time.perf_counter(); n = 0
    while True:
        dense(x, gu, dn, idx, w); n += 1
        if evs[-1][1].query():
            break
    cpu_ms = (time.perf_counter() - t0) / n * 1e3
    torch.cuda.synchronize()
    uva_ms = sum(s.elapsed_time(e) for s, e in evs) / 3
    emit(what="concurrent", uva_alone_gbps=round(nbytes / alone_uva / 1e6, 1), cpu_dense_alone_ms=round(alone_cpu, 2),
         uva_with_cpu_gbps=round(nbytes / uva_ms / 1e6, 1), cpu_dense_with_uva_ms=round(cpu_ms, 2),
         cpu_dense_alone_gbps=round(E * per_expert / alone_cpu / 1e6, 1),
         cpu_dense_with_uva_gbps=round(E * per_expert / cpu_ms / 1e6, 1), cpu_passes=n)


if __name__ == "__main__":
    main()
