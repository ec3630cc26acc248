"""runtime/pinned.py: a pinned arena advises transparent huge pages before its pages are touched (CPU: the CUDA
registration faked; the kernel's own record of the advice read back from /proc/self/smaps)."""

from __future__ import annotations

import mmap
import re
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import ROOT  # noqa: E402

from runtime import pinned  # noqa: E402

SMAPS = Path("/proc/self/smaps")
needs_madvise = pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE") or not SMAPS.exists(),
                                   reason="no MADV_HUGEPAGE or no /proc/self/smaps (not Linux)")


def vm_flags(address: int) -> set[str]:
    """The kernel's VmFlags of the mapping holding ``address`` ('hg': huge pages advised)."""
    inside = False
    for line in SMAPS.read_text().splitlines():
        m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if m:
            inside = int(m.group(1), 16) <= address < int(m.group(2), 16)
        elif inside and line.startswith("VmFlags:"):
            return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


class FakeCudart:
    """cudaHostRegister / cudaHostUnregister that succeed and remember what they saw."""

    def __init__(self) -> None:
        self.registered: list[int] = []

    def cudaHostRegister(self, ptr, size, flags):  # noqa: N802 - CUDA's name
        self.registered.append(ptr)
        return 0

    def cudaHostUnregister(self, ptr):  # noqa: N802
        self.registered.remove(ptr)
        return 0


@pytest.fixture
def fake_cuda(monkeypatch):
    fake = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    return fake


@needs_madvise
@pytest.mark.parametrize("huge", [True, False])
def test_a_pinned_arena_advises_huge_pages_as_set(fake_cuda, monkeypatch, huge):
    monkeypatch.setattr(pinned, "HUGE_PAGES", huge)
    weights = [torch.randn(3, 1000, 700), torch.arange(5000, dtype=torch.int32)]
    arena, views = pinned.pack(weights, pin=True)
    try:
        assert arena.registered and fake_cuda.registered == [arena.storage.data_ptr()]
        assert arena.huge is huge
        assert ("hg" in vm_flags(arena.storage.data_ptr())) is huge
        assert all(torch.equal(v, w) for v, w in zip(views, weights))  # the layout is the same either way
    finally:
        arena.close()
    assert not arena.huge and fake_cuda.registered == []


def test_plain_arenas_are_not_advised(monkeypatch):
    monkeypatch.setattr(pinned, "HUGE_PAGES", True)
    arena = pinned.HostArena(1 << 20, pin=False)
    assert not arena.huge and not arena.registered


def test_a_refused_advice_is_no_error():
    class Refusing:
        def madvise(self, *_):
            raise OSError(22, "Invalid argument")

    assert pinned.advise_huge_pages(Refusing()) is False


def test_the_pages_probe_runs_on_the_cpu(capsys):
    sys.path.insert(0, str(ROOT / "bench"))
    import json

    import probe_host_pages

    threads = torch.get_num_threads()
    try:
        assert probe_host_pages.main(["--small", "--repeat", "2"]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0]["cuda"] is False
    measured = rows[1:]
    assert [r["memory"] for r in measured] == ["plain", "pinned 4k", "pinned huge"]
    assert all(r["bmm_span_gbps"] > 0 and r["padded_pass_32_ms"] > 0 for r in measured)
