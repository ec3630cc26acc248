"""One rank's spec: every param's shard decided (the spec's ``shard:``, else planner/tp/shard_rules.py) and its
shape replaced by the rank's part. Every rank's part has the same shape (splits are even), so one rank spec
serves all ranks. Deciding only; the words are in planner/tp/notes.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas.errors import InputError, Problem, format_path
from schemas.shard import local_shape, split_dim
from schemas.spec import AttentionSpec, SpecFile
from schemas.spec_layers import REPEAT_TOKEN

from planner.tp.shard_rules import default_rule
from planner.tp.heads import NEEDS, head_split, module_of

BY_HEADS = ("attention q/k/v", "attention output")  # the default rules whose rows are heads x head_dim
FIX_HEADS = "give it shard: explicitly, or a world size the heads allow"


@dataclass(frozen=True)
class Decided:
    """The shard of one param of a spec entry and why."""

    shard: str
    rule: str | None  # the default rule's description; None when the spec says the shard
    nbytes: int  # of the whole param


@dataclass
class Split:
    """The rank spec and, per spec entry (``model.layers[i]``), each param's shard."""

    world_size: int
    spec: SpecFile  # the rank's spec: shapes are the rank's parts
    shards: list[dict[str, Decided]]  # by entry, then param name
    names: list[list[str]]  # by entry: the layer names it expands to
    unmatched: dict[str, int] = field(default_factory=dict)  # param (first layer's name) -> bytes in all layers
    by_rows: list[str] = field(default_factory=list)  # attention params split by rows, the heads unknown

    def by_layer(self) -> dict[str, dict[str, str]]:
        """layer name -> param name -> shard, over the expanded layers."""
        out: dict[str, dict[str, str]] = {}
        for names, shards in zip(self.names, self.shards):
            row = {rel: d.shard for rel, d in shards.items()}
            for name in names:
                out[name] = row
        return out

    def bytes_by_shard(self) -> dict[str, int]:
        """Bytes of the whole model by shard kind (each param counted once per layer it appears in)."""
        out: dict[str, int] = {}
        for names, shards in zip(self.names, self.shards):
            for d in shards.values():
                out[d.shard] = out.get(d.shard, 0) + d.nbytes * len(names)
        return out

    @property
    def replicated_bytes(self) -> int:
        return self.bytes_by_shard().get("replicated", 0)

    def row_parallel_layers(self) -> int:
        """Layers holding a row-parallel (dim1) param: each needs an all-reduce of its output."""
        return sum(len(names) for names, shards in zip(self.names, self.shards)
                   if any(d.shard == "dim1" for d in shards.values()))


class ShardError(InputError):
    """Params that cannot be split as asked; each problem carries ``loc`` (its place in the spec file)."""

    def __init__(self, problems: list[Problem], locs: list[tuple[Any, ...]]) -> None:
        super().__init__(problems)
        self.locs = locs

    def located(self, source: str, text: str) -> InputError:
        """The same problems pointing at ``source``'s lines."""
        from schemas.errors import line_of
        from schemas.yaml_lines import load_with_lines

        data, lines = load_with_lines(text)
        return InputError([Problem(p.text, source, line_of(loc, data, lines), p.field)
                           for p, loc in zip(self.problems, self.locs)])


def _layer_names(entry: Any) -> list[str]:
    if entry.repeat is None:
        return [entry.name]
    return [entry.name.replace(REPEAT_TOKEN, str(i)) for i in range(entry.start, entry.start + entry.repeat)]


def _why(shard: str, rule: str | None) -> str:
    return f"shard {shard}" + (f" (the default for {rule})" if rule else "")


def _check(rel: str, spec: Any, shard: str, rule: str | None, world_size: int,
           attention: AttentionSpec | None) -> str | None:
    """Why param ``rel`` cannot be split ``shard`` into ``world_size`` parts, or None."""
    dim = split_dim(shard)
    if dim is None or world_size == 1:
        return None
    shape = list(spec.shape)
    fix = "give it shard: replicated" if rule else "choose another shard"
    if shard == "kv_head":
        if attention is None:
            return f"shard kv_head splits {rel} by its KV heads, which the spec does not give; {NEEDS}"
        if not shape or shape[0] % attention.kv or world_size % attention.kv:
            return (f"shard kv_head gives each rank one of the {attention.kv} KV heads of {rel} (shape {shape}), "
                    f"which needs dim 0 and the world size {world_size} to be multiples of {attention.kv}; {fix}")
        return _strided(rel, spec, shard, rule)
    if dim >= len(shape):
        return (f"{_why(shard, rule)} splits dim {dim}, but {rel} has {len(shape)} dim(s) (shape {shape}); {fix}")
    if shape[dim] % world_size:
        return (f"{_why(shard, rule)} splits dim {dim} of size {shape[dim]} (shape {shape}), which does not divide "
                f"by the tensor-parallel world size {world_size}; {fix} or a world size that divides {shape[dim]}")
    return _strided(rel, spec, shard, rule)


def _strided(rel: str, spec: Any, shard: str, rule: str | None) -> str | None:
    if spec.stride is not None:
        return (f"{_why(shard, rule)} splits {rel}, whose stride {list(spec.stride)} says it is not contiguous: "
                "the layout of a rank's part is not known; drop stride or give it shard: replicated")
    return None


def split_spec(spec: SpecFile, world_size: int) -> Split:
    """The rank spec of ``spec`` at ``world_size`` ranks; ShardError naming every param that cannot be split."""
    if world_size < 1:
        raise InputError(f"the tensor-parallel world size must be 1 or more (got {world_size})")
    data = spec.model_dump(mode="python", exclude_unset=True)
    problems: list[Problem] = []
    locs: list[tuple[Any, ...]] = []
    shards: list[dict[str, Decided]] = []
    names: list[list[str]] = []
    unmatched: dict[str, int] = {}
    expanded = spec.model.expanded()
    attention = spec.model.attention
    by_rows: list[str] = []
    first = 0  # position of the entry's first expanded layer
    for i, entry in enumerate(spec.model.layers):
        layer_names = _layer_names(entry)
        names.append(layer_names)
        tensors = {t.name: t for t in expanded[first].params}
        first += len(layer_names)
        probe = entry.name.replace(REPEAT_TOKEN, str(entry.start))  # kinds ignore the numbers
        row: dict[str, Decided] = {}
        for rel, p in entry.params.items():
            rule = None if p.shard is not None else default_rule(probe, rel, p.kind, p.buffer)
            shard = p.shard or (rule.shard if rule else "replicated")
            why = None
            if rule is not None and rule.what in BY_HEADS and world_size > 1 and shard != "replicated":
                if attention is None:
                    by_rows.append(f"{layer_names[0]}.{rel}")
                else:
                    heads = head_split(module_of(rel), shard, world_size, attention, p.shape)
                    shard = heads.shard
                    why = None if heads.problem is None else f"{_why(shard, rule.what)}: {heads.problem}; {FIX_HEADS}"
            nbytes = tensors[rel].nbytes
            row[rel] = Decided(shard, rule.what if rule else None, nbytes)
            if p.shard is None and rule is None:
                unmatched[f"{layer_names[0]}.{rel}"] = nbytes * len(layer_names)
            why = why or _check(rel, p, shard, rule.what if rule else None, world_size, attention)
            loc = ("model", "layers", i, "params", rel) + (("shard",) if p.shard is not None else ())
            if why is not None:
                problems.append(Problem(why, field=format_path(loc)))
                locs.append(loc)
                continue
            param = data["model"]["layers"][i]["params"][rel]
            param["shape"] = list(local_shape(p.shape, shard, world_size, attention.kv if attention else None))
            param["shard"] = shard
        shards.append(row)
    if problems:
        raise ShardError(problems, locs)
    return Split(world_size, SpecFile.model_validate(data), shards, names, unmatched, by_rows)
