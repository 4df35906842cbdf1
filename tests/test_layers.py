"""The package's layers point one way and its modules import no cycle (read from the source, imports inside
functions included): errors / io / params <- engine <- hparams <- worlds <- metrics <- pipeline <- figures
(hparams: the jobs' hyperparameter classes, whose helpers build engine objects). Inside the engine, its rooms point
one way too: models <- rules <- decoding <- methods (the registry)."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "lantern"
LAYERS = ["errors", "io", "params", "engine", "hparams", "worlds", "metrics", "pipeline", "figures"]
# the engine's rooms, lower to higher: the networks and their files; the acceptance rules and the neighbour sets they
# read; the decoding loops, their drafting kinds and rounds; the method registry (engine/methods.py) on top
ENGINE_ROOMS = ["models", "rules", "decoding", "methods"]


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


def room(module: str) -> int:
    """The engine room of lantern.engine.<room>[.<module>]; the package lantern.engine itself sits on top."""
    parts = module.split(".")
    return ENGINE_ROOMS.index(parts[2]) if len(parts) > 2 and parts[2] in ENGINE_ROOMS else len(ENGINE_ROOMS)


def engine_modules() -> list[str]:
    return [m for m in imports_cache if m.startswith("lantern.engine.")]


def test_every_engine_module_sits_in_a_room():
    assert [m for m in engine_modules() if m.split(".")[2] not in ENGINE_ROOMS] == []


def test_engine_imports_only_point_down_the_rooms():
    upward = [(m, i) for m in engine_modules() for i in imports_cache[m]
              if i.startswith("lantern.engine.") and room(i) > room(m)]
    assert upward == []


def test_no_engine_module_is_named_after_a_past_design():
    """Every drafting kind decodes a batch through the one loop: no module is named for being batched."""
    assert [m for m in engine_modules() if m.rsplit(".", 1)[-1].startswith("batched")] == []


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
    kinds = {f"lantern.engine.decoding.{m}" for m in
             ["chain", "trees", "jacobi", "chain_rounds", "tree_rounds", "chain_graph", "tree_shapes"]}
    assert not deps & (kinds | {"lantern.engine.methods"})


imports_cache = imports()
