"""The package's folders are the pipeline: imports point down the layers, never up, no cycles."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gatekeeper"

# Rooms and their layer, bottom first. A module may import its own room and any lower layer;
# rooms that share a layer (run and gate) never import each other.
LAYERS: dict[str, int] = {
    "gatekeeper": 0,  # the package root: __version__ only
    "gatekeeper.errors": 0,
    "gatekeeper.proc": 0,
    "gatekeeper.text": 0,
    "gatekeeper.resources": 0,
    "gatekeeper.git": 0,
    "gatekeeper.policy": 1,
    "gatekeeper.receipt": 2,
    "gatekeeper.sandbox": 3,
    "gatekeeper.run": 4,
    "gatekeeper.gate": 4,
    "gatekeeper.report": 5,
    "gatekeeper.commands": 6,
    "gatekeeper.cli": 7,
    "gatekeeper.hookrun": 7,
    "gatekeeper.__main__": 8,
}
# Bottom helpers must not form cycles with each other either; their order:
HELPER_ORDER = ["gatekeeper", "gatekeeper.errors", "gatekeeper.text", "gatekeeper.resources",
                "gatekeeper.proc", "gatekeeper.git"]  # fmt: skip


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def room_of(module: str) -> str:
    best = ""
    for room in LAYERS:
        if (module == room or module.startswith(room + ".")) and len(room) > len(best):
            best = room
    assert best, f"{module} is in no room of the layout; add it to LAYERS"
    return best


def imports_of(path: Path, module: str, known: set[str]) -> set[str]:
    """Every gatekeeper module that path imports, at module level or inside functions."""
    found: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "gatekeeper")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "gatekeeper":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    found.discard(module)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports_of(p, m, known) for m, p in mods.items()}


def test_every_module_is_in_a_room() -> None:
    for module in modules():
        room_of(module)


def test_imports_point_down() -> None:
    upward = []
    for module, targets in graph().items():
        room = room_of(module)
        for target in targets:
            other = room_of(target)
            if other == room:
                continue
            if LAYERS[other] > LAYERS[room] or (LAYERS[other] == LAYERS[room] and LAYERS[room]):
                upward.append(f"{module} imports {target} ({other} is not below {room})")
            if LAYERS[room] == LAYERS[other] == 0:
                if HELPER_ORDER.index(other) > HELPER_ORDER.index(room):
                    upward.append(f"{module} imports {target} (helpers import only lower helpers)")
    assert not upward, "\n".join(upward)


def test_no_import_cycles() -> None:
    edges = graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            # importing a package runs its __init__; importing a submodule of one's own package
            # is not a cycle through it.
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "\n".join(cycles)


def test_package_docstrings_say_the_job() -> None:
    for init in PACKAGE.rglob("__init__.py"):
        tree = ast.parse(init.read_text())
        assert ast.get_docstring(tree), f"{init} has no docstring saying its one job"


@pytest.mark.parametrize("entry", ["gatekeeper.cli", "gatekeeper.sandbox.supervise.__main__"])
def test_entry_points_import_nothing_upward(entry: str) -> None:
    """What `python -c "import X"` loads stays inside the rooms X may use."""
    code = (
        f"import sys, importlib; importlib.import_module({entry!r}); "
        "print('\\n'.join(m for m in sys.modules if m.split('.')[0] == 'gatekeeper'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    room = LAYERS[room_of(entry)]
    for loaded in out.stdout.split():
        assert LAYERS[room_of(loaded)] <= room, f"{entry} loads {loaded}"
    if entry.startswith("gatekeeper.sandbox.supervise"):
        # The supervisor starts for every sandboxed command: no pydantic, no policy loader.
        assert "gatekeeper.policy.model" not in out.stdout.split()
