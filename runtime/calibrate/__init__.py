"""Measure a hardware profile on the local GPU (``planner calibrate``): link, UVA, memory,
matmul and eager-PyTorch CPU costs, in about a minute (52-55 s on the H200). One module a measurement:
``timers`` (the clocks), ``link`` (copies, UVA reads, matmuls), ``cpu`` (issue costs), ``experts`` (grouped expert
matmuls), ``block`` (what a block costs beyond its matrices), ``workspace``, and the host's expert kernel in
runtime/calibrate_host.py; this module runs them in order (``calibrate``).

Every figure is the median of several CUDA-event (GPU work) or wall-clock (CPU issue) timings:
- ``h2d_gbps``: pinned host -> GPU copies of 256 MiB;
- ``uva_gbps``, ``uva_call_ms``, ``uva_passes``: ``x @ W.T`` with an 8192x8192 weight read through a UVA view
  of pinned host memory, at 1 ... 4096 tokens, and at 1 token with a 1024x4096 one: the line through the two
  1-token reads gives the rate and the fixed time a matmul pays beyond its bytes; passes = bytes read
  ((time - fixed) x UVA rate) / weight bytes; ``uva_passes_narrow``: the 1024x4096 one's at the same rows
  (a narrow weight is tiled in shorter tiles of rows: re-read more often);
- ``link_shared_gbps``: a 1 GiB pinned copy on one stream and a 1-token matmul reading another 1 GiB
  weight through UVA on a second stream, started together: 2 GiB / the time until both are done (the
  copy engine and UVA reads share the one host link: docs/DESIGN.md, "Cost model");
- ``gpu_mem_gbps``: the same matmul at 1 token with the weight in GPU memory (a memory-bound GEMV);
- ``matmul_tflops``: the same matmul at 4096 tokens in GPU memory;
- ``launch_us``: CPU time per small eager kernel; ``copy_call_us``: per small async copy (these and the next
  bullet's costs are measured at calibrate's start and again at its end, and the lower of each kept: ``least_cpu``);
- ``block_cpu_us``, ``moe_block_cpu_us``, ``model_cpu_us``, ``expert_cpu_us``, ``moe_sync``: tiny transformers
  Llama and Qwen3-MoE models (when transformers is installed): the CPU time one more dense or MoE
  decoder block, or one more routed expert per token, adds to an eager forward, and the time the tiny Llama's
  forward spends outside its blocks (the intercept of its two depths); a cost per expert
  means the MoE block loops over experts (and reads the routing back first: ``moe_sync``);
- ``uva_expert_call_ms``, ``uva_expert_passes``, ``expert_tflops`` (and by rows), ``expert_gbps``: a Qwen3-MoE
  experts module with its weights resident, then read through UVA: the time beyond the bytes it reads per grouped expert
  matmul, its re-reads of the experts by the rows each sees (uniform random routing), its compute rate at the
  most rows, and its read rate from GPU memory by the experts touched;
- ``attention_tflops``, ``elementwise_bytes``: a transformers Llama decoder layer of Llama-3-8B's shape
  (resident) at 2,048 tokens, and scaled dot-product attention alone at its shape (causal): the attention's
  flops / its time; and what the layer's time leaves after its matmuls' roofline (at the figures measured
  above) and the attention, as bytes at ``gpu_mem_gbps`` per token and output element of its matrices
  (planner/cost/block.py reads them back the same way);
- ``block_gpu_us``, ``moe_block_gpu_us``: a decode step replayed as a CUDA graph, of the tiny Llama and of a
  Qwen3-MoE of real width (``MOE_FLOOR_SHAPE``): the GPU time one more block adds beyond its weights' reads
  (its kernels' fixed times; ``block_gpu_floor``);
- ``matmul_gbps_rows``: a Llama of Llama-3-8B's width replayed as a CUDA graph at decode steps of 1 ... 128
  sequences, at two depths (a block: the difference, with the mask the model builds under capture): its
  matrices' bytes over the time left beyond the block floor and elementwise work (``block_reads``; a decode
  batch reads its weights slower than a lone GEMV);
- ``kv_read_gbps``: scaled dot-product attention of a decode step over a 4,096-token KV cache (32 sequences,
  Llama-3-8B's heads) replayed as a CUDA graph: the cache's bytes / its time (``kv_read``);
- ``host_*``: the host CPU's routed-expert kernel for the cpu backend (runtime/calibrate_host.py);
- ``workspace_bytes``: what a matmul and an attention leave allocated on a fresh stream beyond their
  outputs (cuBLAS's workspace), the allowance every plan's peak counts.
"""

from __future__ import annotations

import datetime
import time

import torch

from runtime.calibrate.block import (DENSE_ROWS, LLAMA_8B_BLOCK, MOE_FLOOR_BLOCKS, MOE_FLOOR_SHAPE, REPLAY_BLOCKS,
                                     block_compute, block_gpu_floor, block_reads, kv_read, moe_block_bytes, read_by_rows)
from runtime.calibrate.cpu import (TINY, TINY_BLOCKS, TINY_WIDE_HEADS, _by_depth, _forward_ms, _per_block_us,
                                   block_cpu_us, cpu_costs, model_cpu_costs, tiny_llama, tiny_moe)
from runtime.calibrate.experts import COMPUTE_ROWS, EXPERT_ROWS, _uniform_routing, moe_experts, tflops_by_rows
from runtime.calibrate.link import TOKENS, link, matmuls, shared_link, uva_line
from runtime.calibrate.timers import QUEUE_CYCLES, captured, gpu_ms, graph_ms
from runtime.calibrate.workspace import workspace
from runtime.calibrate_host import host_experts
from schemas.hardware_profile import HardwareProfile

__all__ = ["COMPUTE_ROWS", "DENSE_ROWS", "EXPERT_ROWS", "LLAMA_8B_BLOCK", "REPLAY_BLOCKS",
           "MOE_FLOOR_BLOCKS", "MOE_FLOOR_SHAPE", "QUEUE_CYCLES", "TINY", "TINY_BLOCKS",
           "TINY_WIDE_HEADS", "TOKENS", "block_compute", "block_cpu_us", "block_gpu_floor",
           "block_reads", "_by_depth", "calibrate", "captured", "cpu_costs", "cpu_figures", "least_cpu",
           "_forward_ms", "gpu_ms", "graph_ms", "kv_read", "link", "matmuls", "model_cpu_costs", "moe_block_bytes",
           "moe_experts", "_per_block_us", "read_by_rows", "shared_link", "steadiness", "tflops_by_rows", "tiny_llama",
           "tiny_moe", "_uniform_routing", "uva_line", "warm_up", "workspace"]


# how long calibrate keeps an idle GPU and its link busy before it times anything
WARM_UP_S = 3.0


def warm_up(device: torch.device, seconds: float = WARM_UP_S) -> None:
    """Matmuls and pinned copies for ``seconds``, so that an idle GPU's clocks and its host link's power state have
    left their idle levels before the first timing. On a freshly started H200 (SM clock 345 MHz at rest) calibrate
    measured the link at 46.7 and 46.5 GB/s and GPU memory at 1,967 and 2,226 GB/s in two runs (2026-12-02,
    bench/results/predict-h200-2026-12-02m and -n) where a run right after other work on the same machine kind
    measured 55.2 and 2,820, and the first run's copy-bound plans then ran at 55."""
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    host = torch.empty(64 * 2**20, dtype=torch.uint8).pin_memory()
    on_gpu = torch.empty_like(host, device=device)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        on_gpu.copy_(host, non_blocking=True)
        torch.cuda.synchronize(device)
    del a, host, on_gpu


# the most the link's rate may differ between calibrate's first and last measurement of it for a steady machine
STEADY_SHARE = 0.05


def steadiness(first_gbps: float, last_gbps: float) -> dict[str, object]:
    """The link measured at calibrate's start and again at its end; ``unsteady``: a sentence to show the user when
    they differ by more than ``STEADY_SHARE`` (something else used the machine, or it left an idle state during
    the run: its figures are not to be trusted), else None."""
    change = last_gbps / first_gbps - 1.0
    unsteady = None
    if abs(change) > STEADY_SHARE:
        unsteady = (f"the host link measured {first_gbps:.1f} GB/s at calibrate's start and {last_gbps:.1f} at its "
                    f"end ({change:+.0%}): the machine was not steady while it was measured; run calibrate again "
                    "when nothing else uses the GPU or the host")
    return {"h2d_gbps_first": round(first_gbps, 3), "h2d_gbps_last": round(last_gbps, 3), "unsteady": unsteady}


# the issue costs calibrate measures twice, at its start and at its end, keeping the lower of each
CPU_FIGURES = ("launch_us", "copy_call_us", "block_cpu_us", "moe_block_cpu_us", "model_cpu_us", "expert_cpu_us")


def cpu_figures(device: torch.device) -> dict[str, object]:
    """The issue costs: a kernel's and a copy's, the tiny models' blocks' (runtime/calibrate/cpu.py)."""
    return {**cpu_costs(device), **model_cpu_costs(device)}


def least_cpu(first: dict[str, object], last: dict[str, object]) -> dict[str, object]:
    """Each of ``CPU_FIGURES`` the lower of its two measurements (another process or a slow start only ever adds
    to a CPU cost: on the H200 machine calibrate's first minute after a start measured ``moe_block_cpu_us`` at
    2,236-2,244 us in two starts and 1,257 in a third, where the benchmark that followed in the first of them and
    in the third issued the same launched experts call in 910 and 907 us: docs/BENCHMARKS.md, 2026-12-04); the
    others as first measured."""
    return {k: min(v, last[k]) if k in CPU_FIGURES and k in last else v for k, v in first.items()}


def calibrate(device: str | torch.device = "cuda", name: str | None = None) -> tuple[HardwareProfile, dict]:
    """Measure the local GPU; returns the profile and the raw timings."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError("calibrate measures a CUDA GPU, and none is available here")
    warm_up(device)
    figures: dict[str, object] = {}
    figures.update(link(device))
    figures.update(shared_link(device))
    figures.update(matmuls(device))
    first_cpu = cpu_figures(device)
    figures.update(first_cpu)
    figures.update(moe_experts(device, float(figures["uva_gbps"])))
    figures.update(host_experts(device))
    figures.update(block_compute(device, float(figures["matmul_tflops"]), float(figures["gpu_mem_gbps"])))
    figures.update(block_gpu_floor(device, gpu_mem_gbps=float(figures["gpu_mem_gbps"]),
                                   expert_gbps=figures.get("expert_gbps")))
    figures.update(block_reads(device, float(figures.get("block_gpu_us", 0.0)),
                               float(figures.get("elementwise_bytes", 0.0)), float(figures["gpu_mem_gbps"])))
    figures.update(kv_read(device))
    figures.update(workspace(device))
    raw = {k: figures.pop(k) for k in ("raw_uva_ms", "raw_gpu_ms", "raw_link", "raw_experts", "raw_block_ms",
                                    "raw_block_depth_ms")
           if k in figures}
    raw["steady"] = steadiness(float(figures["h2d_gbps"]), link(device)["h2d_gbps"])
    last_cpu = cpu_figures(device)
    raw["cpu_first"], raw["cpu_last"] = first_cpu, last_cpu
    figures.update(least_cpu(first_cpu, last_cpu))
    gpu = torch.cuda.get_device_name(device)
    day = datetime.date.today().isoformat()
    figures.setdefault("block_cpu_us", 30 * float(figures["launch_us"]))  # no transformers: ~30 kernels
    figures.setdefault("moe_block_cpu_us", 60 * float(figures["launch_us"]))
    figures.setdefault("expert_cpu_us", 0.0)
    profile = HardwareProfile(
        name=name or gpu.replace("NVIDIA ", "").lower().replace(" ", "-"),
        source=f"planner calibrate on {gpu}, torch {torch.__version__}, {day}",
        **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in figures.items()})
    return profile, raw
