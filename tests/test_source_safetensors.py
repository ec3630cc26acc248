"""`planner spec --from-safetensors`: headers only, dtypes, layer grouping and order, shards,
bad input; and the round trip header -> spec -> plan -> apply on a module loaded from the file."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from conftest import weights_only
import yaml
from cli_samples import invoke

from planner.sources.safetensors_file import DTYPES, HeaderTensor
from planner.sources.safetensors_header import spec_from_safetensors
from planner.sources.safetensors_index import read_checkpoint
from planner.sources.tensor_layers import group_layers
from schemas.errors import InputError
from schemas.io import load_model
from schemas.spec import SpecFile


def write_raw(path: Path, header: dict | bytes, data: bytes = b"", length: int | None = None) -> Path:
    """A safetensors file written byte by byte from the documented layout."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def entry(dtype: str, shape: list[int], begin: int, size: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, begin + size]}


def test_raw_header_dtypes_and_shapes(tmp_path: Path) -> None:
    header = {
        "__metadata__": {"format": "pt"},
        "lm_head.weight": entry("BF16", [10, 4], 0, 80),
        "model.embed_tokens.weight": entry("F16", [10, 4], 80, 80),
        "model.layers.0.q.weight": entry("I8", [4, 4], 160, 16),
        "model.layers.0.q.scale": entry("F32", [4], 176, 16),
        "model.layers.0.packed": entry("U8", [2, 4], 192, 8),
        "model.layers.0.fp8": entry("F8_E4M3", [4, 4], 200, 16),
        "model.layers.0.mask": entry("BOOL", [4], 216, 4),
        "model.layers.0.ids": entry("I64", [2], 220, 16),
        "model.norm.weight": entry("BF16", [4], 236, 8),
    }
    f = write_raw(tmp_path / "m.safetensors", header, bytes(244))
    tensors = {t.name: t for t in read_checkpoint(f)}
    assert tensors["model.layers.0.q.weight"].dtype == "int8"
    assert tensors["model.layers.0.fp8"].dtype == "float8_e4m3fn"
    assert tensors["model.layers.0.mask"].dtype == "bool"
    assert tensors["lm_head.weight"].shape == (10, 4) and tensors["lm_head.weight"].nbytes == 80
    spec = spec_from_safetensors(f)
    assert spec.model.name == "m"
    layers = spec.model.expanded()
    assert [layer.name for layer in layers] == ["model.embed_tokens", "model.layers.0", "model.norm", "lm_head"]
    block = {t.name: (t.dtype, t.shape, t.nbytes) for t in layers[1].params}
    assert block["packed"] == ("uint8", (2, 4), 8) and block["ids"] == ("int64", (2,), 16)
    assert sum(layer.nbytes for layer in layers) == 244  # byte-exact against the data section


def test_every_mapped_dtype_is_known_to_the_spec(tmp_path: Path) -> None:
    header, off = {}, 0
    for i, (st, ours) in enumerate(DTYPES.items()):
        size = 3 * SpecFile.model_validate(
            {"model": {"name": "x", "dtype": ours, "layers": [{"name": "a", "params": {"w": [3]}}]}}
        ).model.expanded()[0].nbytes // 3
        header[f"blocks.0.t{i}"] = entry(st, [3], off, size)
        off += size
    spec = spec_from_safetensors(write_raw(tmp_path / "all.safetensors", header, bytes(off)))
    got = {t.name: t.dtype for t in spec.model.expanded()[0].params}
    assert sorted(got.values()) == sorted(DTYPES.values())


def test_layer_order_embeddings_blocks_by_index_norm_head() -> None:

    names = ["lm_head.weight", "model.norm.weight", "model.layers.10.mlp.w", "model.layers.2.mlp.w",
             "model.layers.0.mlp.w", "model.embed_tokens.weight", "model.layers.1.mlp.experts.3.w",
             "model.layers.1.mlp.experts.10.w", "model.layers.1.mlp.experts.2.w"]
    tensors = [HeaderTensor(n, "bfloat16", (2,), 4, "f") for n in names]
    entries = group_layers(tensors)
    assert [e.name for e in entries] == ["model.embed_tokens", "model.layers.0", "model.layers.1",
                                         "model.layers.2", "model.layers.10", "model.norm", "lm_head"]
    assert list(entries[2].params) == ["mlp.experts.2.w", "mlp.experts.3.w", "mlp.experts.10.w"]


def test_a_module_above_another_is_one_layer() -> None:

    tensors = [HeaderTensor(n, "float32", (2,), 8, "f")
               for n in ["enc.scale", "enc.proj.weight", "enc.proj.bias", "blocks.0.w"]]
    entries = group_layers(tensors)
    assert [(e.name, sorted(e.params)) for e in entries] == [
        ("enc", ["proj.bias", "proj.weight", "scale"]), ("blocks.0", ["w"])]


# ---------------------------------------------------------------------------
# bad input: exit 2, one clear line, no traceback

BAD = [
    ("missing", None, "no such file or folder"),
    ("short", b"\x01\x02", "shorter than the 8-byte header length"),
    ("length-beyond-size", "LEN", "header length says"),
    ("not-json", "NOTJSON", "not valid JSON"),
    ("json-list", b"[1, 2]", "expected an object"),
    ("unknown-dtype", {"a.w": entry("Q4", [2], 0, 2)}, "unsupported dtype 'Q4'"),
    ("bad-shape", {"a.w": entry("F32", [-1], 0, 4)}, "shape must be a list of non-negative integers"),
    ("offsets-size", {"a.w": entry("F32", [2], 0, 4)}, "needs 8"),
    ("truncated-data", {"a.w": entry("F32", [64], 0, 256)}, "truncated"),
    ("no-module-path", {"w": entry("F32", [2], 0, 8)}, "has no module path"),
    ("no-fields", {"a.w": {"dtype": "F32"}}, "dtype, shape and data_offsets"),
    ("empty", {"__metadata__": {}}, "holds no tensors"),
]


@pytest.mark.parametrize("case,content,expect", BAD, ids=[b[0] for b in BAD])
def test_bad_files_exit_2_with_a_message(tmp_path: Path, case: str, content, expect: str) -> None:
    f = tmp_path / "bad.safetensors"
    if content == "LEN":
        write_raw(f, b"{}", length=10**6)
    elif content == "NOTJSON":
        write_raw(f, b"\xff\xfe not json")
    elif isinstance(content, bytes) and case == "short":
        f.write_bytes(content)
    elif content is not None:
        write_raw(f, content, bytes(0 if case == "empty" else 8))
    result = invoke("spec", "--from-safetensors", str(f))
    assert result.exit_code == 2, result.output
    assert expect in result.stderr, result.stderr
    assert result.stderr.startswith("error: ") and "Traceback" not in result.output


def _sharded(tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    write_raw(folder / "a.safetensors", {"x.0.w": entry("F32", [2], 0, 8)}, bytes(8))
    write_raw(folder / "b.safetensors", {"x.1.w": entry("F32", [2], 0, 8)}, bytes(8))
    return folder


@pytest.mark.parametrize("edit,expect", [
    (lambda d, f: f.__setitem__("weight_map", {"x.0.w": "a.safetensors", "x.1.w": "gone.safetensors"}),
     "names shard 'gone.safetensors'"),
    (lambda d, f: f.__setitem__("weight_map", {"x.0.w": "a.safetensors", "x.9.w": "b.safetensors"}),
     "'x.9.w' is mapped to 'b.safetensors', whose header lacks it"),
    (lambda d, f: f.__setitem__("weight_map", {"x.0.w": "../a.safetensors"}), "expected a file name"),
    (lambda d, f: f.__setitem__("weight_map", {}), "weight_map: expected a non-empty mapping"),
    (lambda d, f: (d / "b.safetensors").write_bytes(b"\x00" * 4), "shorter than the 8-byte"),
    (lambda d, f: f.__setitem__("weight_map", {"x.0.w": "a.safetensors", "x.1.w": "b.safetensors",
                                               "x.2.w": "c.safetensors"})
     or write_raw(d / "c.safetensors", {"x.0.w": entry("F32", [2], 0, 8), "x.2.w": entry("F32", [2], 8, 8)},
                  bytes(16)),
     "c.safetensors: holds tensor 'x.0.w', which"),
])
def test_bad_sharded_folders(tmp_path: Path, edit, expect: str) -> None:
    folder = _sharded(tmp_path)
    index = {"metadata": {"total_size": 16}, "weight_map": {"x.0.w": "a.safetensors", "x.1.w": "b.safetensors"}}
    edit(folder, index)
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    result = invoke("spec", "--from-safetensors", str(folder))
    assert result.exit_code == 2, result.output
    assert expect in result.stderr, result.stderr


def test_folder_edge_cases(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = invoke("spec", "--from-safetensors", str(empty))
    assert result.exit_code == 2 and "no model.safetensors.index.json and no *.safetensors" in result.stderr
    (empty / "model.safetensors.index.json").write_text("{not json")
    result = invoke("spec", "--from-safetensors", str(empty))
    assert result.exit_code == 2 and "not valid JSON" in result.stderr
    folder = _sharded(tmp_path)  # no index: every *.safetensors file
    spec = spec_from_safetensors(folder)
    assert spec.model.name == "ckpt" and [layer.name for layer in spec.model.layers] == ["x.{i}"]


def test_spec_command_needs_exactly_one_source(tmp_path: Path) -> None:
    for args in ((), ("--from-safetensors", "a", "--from-hf-config", "b")):
        result = invoke("spec", *args)
        assert result.exit_code == 2 and "exactly one of" in result.stderr


# ---------------------------------------------------------------------------
# with the safetensors package and torch: real files, cross-checked, and applied

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")
from torch import nn  # noqa: E402


class QBlock(nn.Module):
    """A block with int8 weights, float16 scales, packed uint8 nibbles and a bool mask (all used)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(dim)
        self.qweight = nn.Parameter(torch.randint(-127, 128, (dim, dim), dtype=torch.int8, generator=g),
                                    requires_grad=False)
        self.scale = nn.Parameter(torch.rand(dim, generator=g).half() / 100 + 1e-3, requires_grad=False)
        self.packed = nn.Parameter(torch.randint(0, 256, (dim, dim // 2), dtype=torch.uint8, generator=g),
                                   requires_grad=False)
        self.keep = nn.Parameter(torch.rand(dim, generator=g) > 0.2, requires_grad=False)
        self.norm = nn.LayerNorm(dim, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.qweight.float() * self.scale.float()[:, None]
        lo, hi = (self.packed & 15).float(), (self.packed >> 4).float()
        w = w + torch.cat([lo, hi], dim=1) / 1000
        y = (x.float() @ w.T) * self.keep
        return x + self.norm(y.bfloat16())


class QModel(nn.Module):
    def __init__(self, dim: int = 32, blocks: int = 12, vocab: int = 16) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim, dtype=torch.bfloat16)
        self.layers = nn.ModuleList(QBlock(dim) for _ in range(blocks))
        self.norm = nn.LayerNorm(dim, dtype=torch.float32)
        self.lm_head = nn.Linear(dim, vocab, bias=False, dtype=torch.float16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for block in self.layers:
            x = block(x)
        return self.lm_head(self.norm(x.float()).half())


def save_sharded(model: nn.Module, folder: Path, shards: int = 3) -> None:
    folder.mkdir()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    names = sorted(state)
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        st.save_file({k: state[k] for k in part}, str(folder / file), metadata={"format": "pt"})
        weight_map.update({k: file for k in part})
    index = {"metadata": {"total_size": sum(v.numel() * v.element_size() for v in state.values())},
             "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def test_header_reader_agrees_with_safe_open(tmp_path: Path) -> None:
    from safetensors import safe_open

    tensors = {"a.0.bf16": torch.zeros(3, 5, dtype=torch.bfloat16), "a.0.f16": torch.zeros(7, dtype=torch.float16),
               "a.0.i8": torch.zeros(2, 2, dtype=torch.int8), "a.0.u8": torch.zeros(9, dtype=torch.uint8),
               "a.0.f8": torch.zeros(4, dtype=torch.float8_e5m2), "a.0.b": torch.zeros(3, dtype=torch.bool),
               "a.0.i32": torch.zeros(1, dtype=torch.int32), "h.f64": torch.zeros(2, 2, dtype=torch.float64)}
    f = tmp_path / "x.safetensors"
    st.save_file(tensors, str(f))
    ours = {t.name: t for t in read_checkpoint(f)}
    with safe_open(str(f), framework="pt") as sf:
        for name in sf.keys():
            sl = sf.get_slice(name)
            assert list(ours[name].shape) == list(sl.get_shape())
            assert DTYPES[sl.get_dtype()] == ours[name].dtype == str(tensors[name].dtype).removeprefix("torch.")


# (header, data bytes, whether the format allows it): every rule of the reader against safe_open
FORMAT_CASES = [
    ({"a.w": entry("F32", [2], 0, 8)}, 8, True),
    ({"a.w": entry("F32", [1], 4, 4), "b.w": entry("F32", [1], 0, 4)}, 4, False),  # wrong size
    ({"b.w": entry("F32", [1], 4, 4), "a.w": entry("F32", [1], 0, 4)}, 8, True),  # any key order
    ({"a.w": entry("F32", [0], 4, 0), "b.w": entry("F32", [1], 0, 4)}, 4, True),  # empty at the end
    ({"a.w": entry("F32", [2], 0, 8), "b.w": entry("F32", [1], 4, 4)}, 8, False),  # overlap
    ({"a.w": entry("F32", [1], 0, 4), "b.w": entry("F32", [1], 8, 4)}, 12, False),  # hole
    ({"a.w": entry("F32", [1], 4, 4)}, 8, False),  # not starting at 0
    ({"a.w": entry("F32", [2], 0, 8)}, 12, False),  # trailing bytes
    ({"a.w": entry("F32", [2], 0, 8)}, 4, False),  # truncated
    ({"__metadata__": ["pt"], "a.w": entry("F32", [2], 0, 8)}, 8, False),
    ({"__metadata__": {"n": 1}, "a.w": entry("F32", [2], 0, 8)}, 8, False),
    ({"__metadata__": None, "a.w": entry("F32", [2], 0, 8)}, 8, True),
    ({"a.w": {"dtype": "F32", "shape": [2], "offsets": [0, 8]}}, 8, False),
    ({"a.w": entry("f32", [2], 0, 8)}, 8, False),
    ({"a.w": entry("F32", [-2], 0, 8)}, 8, False),
    (b'{"a.w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
     b'"a.w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', 8, False),  # duplicate key
]


@pytest.mark.parametrize("header,data,valid", FORMAT_CASES)
def test_reader_rejects_exactly_what_safe_open_rejects(tmp_path: Path, header, data: int, valid: bool) -> None:
    from safetensors import safe_open

    f = write_raw(tmp_path / "x.safetensors", header, bytes(data))
    try:
        with safe_open(str(f), framework="pt") as sf:
            theirs = sorted(sf.keys())
    except Exception:  # noqa: BLE001 - safetensors raises its own error types
        theirs = None
    assert (theirs is not None) == valid
    if valid:
        assert sorted(t.name for t in read_checkpoint(f)) == theirs
    else:
        with pytest.raises(InputError, match=str(f)):
            read_checkpoint(f)


def test_every_header_problem_is_listed_at_once(tmp_path: Path) -> None:
    f = write_raw(tmp_path / "x.safetensors", {"__metadata__": [1], "a.w": entry("Q4", [2], 0, 2),
                                               "b.w": entry("F32", [1.5], 2, 6), "c.w": entry("F32", [2], 0, 8)},
                  bytes(8))
    with pytest.raises(InputError) as err:
        read_checkpoint(f)
    lines = str(err.value).splitlines()
    assert len(lines) == 3 and all(line.startswith(f"{f}: ") for line in lines)
    assert "__metadata__" in lines[0] and "tensor 'a.w'" in lines[1] and "tensor 'b.w'" in lines[2]


def snapshot(model: nn.Module) -> dict:
    return {k: (v.detach().clone(), v.device, v.stride(), id(v)) for k, v in model.state_dict(keep_vars=True).items()}


def test_sharded_checkpoint_round_trips_to_apply(tmp_path: Path) -> None:
    import planner
    import runtime
    from schemas.spec_dump import dump_spec

    torch.manual_seed(0)
    source = QModel()
    save_sharded(source, tmp_path / "ckpt")
    result = invoke("spec", "--from-safetensors", str(tmp_path / "ckpt"), "-o", str(tmp_path / "spec.yaml"))
    assert result.exit_code == 0, result.output
    spec = load_model(SpecFile, tmp_path / "spec.yaml")
    assert spec.model.name == "ckpt"
    assert [layer.name for layer in spec.model.layers] == ["embed_tokens", "layers.{i}", "norm", "lm_head"]
    assert spec.model.layers[1].repeat == 12
    assert load_model(SpecFile, "s", dump_spec(spec)) == spec

    model = QModel()  # a different init, then the checkpoint's values
    state = {}
    for shard in sorted((tmp_path / "ckpt").glob("*.safetensors")):
        state.update(st.load_file(str(shard)))
    model.load_state_dict(state)
    ids = torch.randint(0, 16, (2, 5))
    want = model(ids)
    assert torch.equal(want, source(ids))
    total = sum(layer.nbytes for layer in spec.model.expanded())
    assert total == sum(v.numel() * v.element_size() for v in state.values())  # byte-exact
    for backend in ("prefetch", "uva"):
        plan = planner.plan(weights_only(spec), gpu_budget=total * 7 // 10, backend=backend)  # a toy: weights
        assert any(layer.offloaded for layer in plan.layers)
        offloaded = {p for layer in plan.layers for p in layer.offloaded}
        assert {"qweight", "packed", "keep"} <= offloaded
        snap = snapshot(model)
        with runtime.apply(plan, model, device="cpu"):
            assert torch.equal(model(ids), want)
        for k, (value, device, stride, ident) in snap.items():
            t = model.state_dict(keep_vars=True)[k]
            assert id(t) == ident and t.device == device and t.stride() == stride, k
            assert torch.equal(t.detach(), value) and t.dtype == value.dtype, k
        assert torch.equal(model(ids), want)


def test_describe_of_the_loaded_module_matches_the_checkpoint_spec(tmp_path: Path) -> None:
    import runtime

    model = QModel()
    f = tmp_path / "q.safetensors"
    st.save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(f))
    from_file = spec_from_safetensors(f)
    described = runtime.describe(model, name="q")

    def flat(spec: SpecFile) -> dict:
        return {(layer.name, t.name): (t.shape, t.dtype, t.nbytes) for layer in spec.model.expanded()
                for t in layer.params}

    assert flat(from_file) == flat(described)
    assert [layer.name for layer in from_file.model.expanded()] == \
        [layer.name for layer in described.model.expanded()]


def test_yaml_output_is_compact(tmp_path: Path) -> None:
    f = tmp_path / "m.safetensors"
    st.save_file({"model.layers.0.w": torch.zeros(2, 3, dtype=torch.bfloat16),
                  "model.layers.1.w": torch.zeros(2, 3, dtype=torch.bfloat16),
                  "model.layers.0.s": torch.zeros(2, dtype=torch.float32),
                  "model.layers.1.s": torch.zeros(2, dtype=torch.float32)}, str(f))
    result = invoke("spec", "--from-safetensors", str(f), "--name", "tiny")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"# Made by: planner spec --from-safetensors {f} --name tiny\n")
    data = yaml.safe_load(result.stdout)
    assert data == {"model": {"name": "tiny", "dtype": "bfloat16", "layers": [
        {"name": "model.layers.{i}", "repeat": 2,
         "params": {"s": {"shape": [2], "dtype": "float32"}, "w": [2, 3]}}],
        "param_order": "name"}}  # a header keeps the names, not the module's registration order
    as_json = invoke("spec", "--from-safetensors", str(f), "--name", "tiny", "--format", "json")
    assert json.loads(as_json.stdout) == data


def test_input_error_type() -> None:
    with pytest.raises(InputError):
        read_checkpoint("/nonexistent/x.safetensors")
