"""The layers as a checked contract (docs/design.md, "Layers"): every import in flashstate/ — at module
level, inside functions, or for type checking only — goes to its own layer or below, and no two modules
import each other, however indirectly.

    base      flashstate/*.py (config, envs, sampling_params, sequence, tokenizer, device, ...) and
              diagnostics/ (off the request path)
    ops < layers < models < cache < engine (with distributed/) < server | sim | bench < fleet
    < faces (cli, llm)

Beside the order: server, sim and bench do not import each other, except sim from bench (the simulator
replays bench's workloads); bench (an HTTP client) imports nothing below the server but base modules;
sim runs the real scheduler and cache without tensors, so it imports no ops, layers or models: it reads
model geometry from spec/ and step shapes from engine/step_shapes.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import flashstate

RANKS = {
    "base": 0, "diagnostics": 0, "spec": 0, "ops": 1, "layers": 2, "models": 3, "cache": 4, "engine": 5,
    "distributed": 5, "server": 6, "sim": 6, "bench": 6, "fleet": 7, "faces": 8,
}  # fmt: skip
FACES = {"flashstate", "flashstate.cli", "flashstate.llm"}
# Imports the contract allows for now, each with the reason; the list only shrinks.
PENDING: dict[tuple[str, str], str] = {}


def layer(module: str, modules: set[str]) -> str:
    if module in FACES:
        return "faces"
    parts = module.split(".")
    if (
        len(parts) == 2
        and f"{module}.__init__" not in modules
        and not any(m.startswith(module + ".") for m in modules)
    ):
        return "base"
    return parts[1]


def imports(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module → the flashstate modules it imports (names resolved to the modules that define them)."""
    names = set(sources)

    def resolve(name: str) -> str | None:
        while name and name not in names:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {}
    for module, source in sources.items():
        found = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "flashstate":
                for alias in node.names:  # `from pkg import module` names a module
                    full = f"{node.module}.{alias.name}"
                    found.add(full if full in names else resolve(node.module))
            elif isinstance(node, ast.Import):
                found |= {resolve(a.name) for a in node.names if a.name.split(".")[0] == "flashstate"}
        edges[module] = {m for m in found if m is not None and m != module}
    return edges


def violations(sources: dict[str, str]) -> list[str]:
    """Every import against the contract, and every cycle."""
    edges = imports(sources)
    names = set(sources)
    bad = []
    for module, targets in edges.items():
        src = layer(module, names)
        for target in targets:
            dst = layer(target, names)
            if target == "flashstate" or (module, target) in PENDING:
                continue
            beside = RANKS[dst] == RANKS[src] and src != dst and {src, dst} <= {"server", "sim", "bench"}
            if (
                RANKS[dst] > RANKS[src]
                or (beside and (src, dst) != ("sim", "bench"))
                or (src == "bench" and dst not in ("base", "bench"))
                or (src == "sim" and dst in ("ops", "layers", "models"))
            ):
                bad.append(f"{module} ({src}) imports {target} ({dst})")
    bad += [f"import cycle: {' -> '.join(cycle)}" for cycle in _cycles(edges)]
    return sorted(bad)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def package_sources() -> dict[str, str]:
    root = Path(flashstate.__file__).parent
    sources = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        sources[module] = path.read_text()
    return sources


def test_the_package_keeps_its_layers_and_has_no_import_cycles():
    assert violations(package_sources()) == []


def test_every_pending_exception_is_still_needed():
    edges = imports(package_sources())
    assert [pair for pair in PENDING if pair[1] not in edges.get(pair[0], set())] == []


def test_a_deliberate_violation_fails_the_contract():
    sources = package_sources()
    upward = dict(sources)
    upward["flashstate.cache.block_pool"] += "\nfrom flashstate.engine.scheduler import Scheduler\n"
    assert "flashstate.cache.block_pool (cache) imports flashstate.engine.scheduler (engine)" in violations(
        upward
    )
    typed = dict(sources)  # a type-only import that closes a cycle
    typed["flashstate.cache.tree"] += (
        "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from flashstate.cache.manager import X\n"
    )
    assert any(v.startswith("import cycle:") and "flashstate.cache.tree" in v for v in violations(typed))
    client = dict(sources)
    client["flashstate.bench.client"] += "\nfrom flashstate.engine.llm_engine import LLMEngine\n"
    assert violations(client) == [
        "flashstate.bench.client (bench) imports flashstate.engine.llm_engine (engine)"
    ]
