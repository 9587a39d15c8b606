"""What a young collection walks (`FLASHSTATE_GC_CENSUS=1` on `flashstate serve`): at the start of each
generation 0 or 1 collection, the objects of that generation by type, with the elements of their containers
(a collection visits every element of every container it walks). A diagnosis, not for production: the census
itself walks the generation (~10 ms per 50,000 objects), outside the pause it precedes."""

from __future__ import annotations

import collections
import gc
from collections.abc import Sized

_CONTAINERS = (list, tuple, dict, set, frozenset, collections.deque)


class GcCensus:
    def __init__(self) -> None:
        self.collections = 0
        self.objects: collections.Counter[str] = collections.Counter()
        self.elements: collections.Counter[str] = collections.Counter()
        self.largest: list[tuple[int, str]] = []  # (elements, description), the largest containers seen
        self.tensors: collections.Counter[str] = collections.Counter()  # "cuda int64 1-d view", ...
        # what holds a young tensor: one sampled per collection, its referrers ("list <- ObjectBuilder")
        self.holders: collections.Counter[str] = collections.Counter()

    def take(self, generation: int) -> None:
        self.collections += 1
        young = gc.get_objects(generation)
        tensors = []
        for obj in young:
            name = type(obj).__name__
            self.objects[name] += 1
            if name == "Tensor":
                self.tensors[_kind(obj)] += 1
                tensors.append(obj)
            elif isinstance(obj, _CONTAINERS):
                n = len(obj)
                self.elements[name] += n
                if n >= 1000:
                    self.largest.append((n, _describe(obj)))
        self.largest = sorted(self.largest, reverse=True)[:10]
        if tensors:  # a walk of every tracked object: once per collection
            self.holders.update(_holders(tensors[len(tensors) // 2], ignore=(young, tensors)))

    def describe(self) -> str:
        if not self.collections:
            return "no young collection"
        c = self.collections
        by_objects = ", ".join(f"{t} {n / c:.0f}" for t, n in self.objects.most_common(6))
        by_elements = ", ".join(f"{t} {n / c:.0f}" for t, n in self.elements.most_common(4))
        largest = ", ".join(f"{d} ×{n}" for n, d in self.largest[:6])
        tensors = ", ".join(f"{k} {n / c:.0f}" for k, n in self.tensors.most_common(6))
        holders = ", ".join(f"{k} ×{n}" for k, n in self.holders.most_common(6))
        return (
            f"{c} collections; objects per collection: {by_objects}; container elements per collection: "
            f"{by_elements}; largest containers: {largest}; tensors per collection: {tensors or 'none'}; "
            f"a sampled tensor's holders: {holders or 'none'}"
        )


def _describe(obj: Sized) -> str:
    """`list[int]`, `dict[str, Sequence]`: the container's type and its first element's."""
    if isinstance(obj, dict):
        k, v = next(iter(obj.items()))
        return f"{type(obj).__name__}[{type(k).__name__}, {type(v).__name__}]"
    return f"{type(obj).__name__}[{type(next(iter(obj))).__name__}]"


def _kind(t: object) -> str:
    """`cuda int64 1-d view`: a tensor's device, dtype and rank, and whether it views another's storage."""
    view = " view" if getattr(t, "_base", None) is not None else ""
    return f"{t.device.type} {str(t.dtype).removeprefix('torch.')} {t.dim()}-d{view}"


def _holders(obj: object, ignore: tuple) -> list[str]:
    """The type of each object referring to `obj`; a plain container's own holders after an arrow."""
    out = []
    for ref in gc.get_referrers(obj):
        if any(ref is i for i in ignore):
            continue
        name = type(ref).__name__
        if isinstance(ref, _CONTAINERS):
            up = sorted({type(r).__name__ for r in gc.get_referrers(ref) if not any(r is i for i in ignore)})
            name = f"{name} <- {'/'.join(up[:3]) or '?'}"
        out.append(name)
    return out
