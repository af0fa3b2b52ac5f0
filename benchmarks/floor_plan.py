"""The floor plan's figures, measured from the code's own imports (docs/layout.md).

Prints the layers of the import-linter contract in pyproject.toml, the modules of each package,
the modules over 500 lines, the runtime import cycles between modules (an import under
`if TYPE_CHECKING:` does not run, so it does not count), and the places `TrainConfig` is a
parameter or field type.

    python benchmarks/floor_plan.py
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted((SRC / "thrifty").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def runtime_imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The thrifty modules `name` imports when it runs (at any depth, not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1]
                    + ([base] if base else [])
                )
            # `from package import module` imports the module; `from module import name`, the
            # module (as import-linter counts them)
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith("thrifty"):
                out.add(target)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def main() -> None:
    known = modules()
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in contract["contracts"] if c["type"] == "layers")["layers"]
    print(f"layers in the contract: {len(layers)}")
    for layer in layers:
        print(f"  {layer}")
    per_package = Counter()
    for name in known:
        parts = name.split(".")
        per_package[
            ".".join(parts[:2])
            if len(parts) > 2 or known[name].name == "__init__.py"
            else "thrifty (top-level modules)"
        ] += 1
    print("modules per package:")
    for package, count in sorted(per_package.items()):
        print(f"  {package}: {count}")
    long = {n: len(p.read_text().splitlines()) for n, p in known.items()}
    over = sorted((n, c) for n, c in long.items() if c > 500)
    print(f"modules over 500 lines: {len(over)}" + "".join(f"\n  {n}: {c}" for n, c in over))
    graph = {n: runtime_imports(n, p, known) for n, p in known.items()}
    found = cycles(graph)
    print(f"runtime import cycles: {len(found)}" + "".join(f"\n  {' <-> '.join(g)}" for g in found))
    places = 0
    for path in known.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
                if (
                    "TrainConfig"
                    in ast.unparse(node.annotation).split("[")[0].replace("|", " ").split()
                ):
                    places += 1
    print(f"TrainConfig as a parameter or field type: {places}")


if __name__ == "__main__":
    main()
