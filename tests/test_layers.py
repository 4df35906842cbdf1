"""The package's layers point one way and its modules import no cycle (read from the source, imports inside
functions included): errors / io / params <- engine <- hparams <- worlds <- metrics <- pipeline <- figures
(hparams: the jobs' hyperparameter classes, whose helpers build engine objects)."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "lantern"
LAYERS = ["errors", "io", "params", "engine", "hparams", "worlds", "metrics", "pipeline", "figures"]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    paths = list(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph = {}
    for path in paths:
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lantern"):
                # `from lantern.engine import methods` imports the module lantern.engine.methods
                subs = {f"{node.module}.{a.name}" for a in node.names} & modules
                found |= subs or {node.module}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("lantern")}
        graph[module_name(path)] = found
    return graph


def layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    return LAYERS.index(top) if top in LAYERS else len(LAYERS)  # __main__ and the package face sit on top


def test_imports_only_point_down_the_layers():
    upward = [(m, i) for m, deps in imports().items() for i in deps if i != "lantern" and layer(i) > layer(m)]
    assert upward == []


def test_no_import_cycle():
    graph = {m: {d for d in deps if d in imports_cache} for m, deps in imports_cache.items()}
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for d in graph[m]:
            assert state.get(d) != 1, f"import cycle: {' -> '.join(stack + [m, d])}"
            if d not in state:
                visit(d, stack + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])


def test_the_speculative_loop_knows_no_drafting_kind():
    deps = imports_cache["lantern.engine.decoding.speculative"]
    assert not deps & {"lantern.engine.decoding.chain", "lantern.engine.decoding.trees", "lantern.engine.methods"}


imports_cache = imports()
