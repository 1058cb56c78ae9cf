"""The house rules, read off the code with `ast`: no module over 400 lines, no function over 60, no import circle
between proxy_addon's modules, and every floor imports only the floors below it (docs/architecture.md, "Floors").

An import counts wherever it is written: at the top, inside a function, or under `if TYPE_CHECKING:` (a circle
that only the type checker walks is still a circle a reader walks). `python tests/unit/test_house.py` prints the
counts (scripts/house-counts).
"""

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "proxy_addon"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

# The floors, bottom first: a package (or top-level module) of proxy_addon imports from its own package and from
# the floors below its own, never from its own floor's other entries or from above. `proxy_addon` is the package's
# __init__ (the version).
FLOORS: tuple[tuple[str, ...], ...] = (
    ("proxy_addon", "units", "resources"),  # no import of proxy_addon at all
    ("rules",),  # the pure floor: states, records, intent, fingerprint, redaction, verdicts, answers, host policy
    ("presets",),  # tested rules for known APIs, as config.yaml would write them
    ("agents",),  # who is asking: agents' names, tokens and their hashes, the name off a flow
    ("exceptions", "log"),
    ("keyfiles", "db", "metrics"),  # key files made on first use; engines; the Prometheus metrics
    ("audit",),  # the hash chain, the signed checkpoints, `receipts verify`
    ("config",),  # config.yaml: the sections, the host entries merged into a rules.policy.HostPolicy
    ("suggest",),  # read rules suggested from an OpenAPI document, checked against config's models
    ("protocols",),  # what is journaled and how each protocol reads a request (RequestFacts, routing)
    ("journal", "tracing"),  # the journal: its tables, statements, writes, writer and client; the write span
    ("store",),  # everything else that reads or writes the tables
    ("request", "recovery", "views"),  # one journaled request's path; instance liveness; what people are shown
    ("reconcile",),
    ("admin", "agent_api"),  # the admin server; the agent's own receipts (the agent API)
    ("addons", "agent_env"),  # the mitmproxy addons; `receipts env`'s exports
    ("cli", "addon"),  # the receipts command; the file a plain mitmproxy loads
)
FLOOR_OF = {name: level for level, names in enumerate(FLOORS) for name in names}


@dataclass
class Module:
    name: str  # proxy_addon.request.handler
    path: Path
    lines: int
    tree: ast.Module
    imports: set[str] = field(default_factory=set)  # the proxy_addon modules it imports

    @property
    def part(self) -> str:
        """Its entry in FLOORS: the package under proxy_addon, or the top-level module, or `proxy_addon`."""
        parts = self.name.split(".")
        return parts[1] if len(parts) > 1 else parts[0]


def module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_modules() -> dict[str, Module]:
    return parsed(PACKAGE)


@cache
def parsed(package: Path) -> dict[str, Module]:
    """Every module of the package, parsed once (the tests share it: none changes it)."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        name = module_name(path, package)
        modules[name] = Module(name, path, len(text.splitlines()), ast.parse(text, str(path)))
    for module in modules.values():
        module.imports = set(imported(module, modules)) - {module.name}
    return modules


def imported(module: Module, modules: dict[str, Module]) -> Iterator[str]:
    """The proxy_addon modules `module` imports, each as the most specific module the import names
    (`from proxy_addon.store import receipts` is proxy_addon.store.receipts; `from proxy_addon.store import
    ReceiptStore` is proxy_addon.store, its __init__)."""
    package = module.name if module.path.name == "__init__.py" else module.name.rpartition(".")[0]
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, *([node.module] if node.module else [])])
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                yield name


def long_functions(module: Module) -> Iterator[tuple[str, int]]:
    """(qualified name, lines) of each function or method over MAX_FUNCTION_LINES, nested ones included."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    length = (child.end_lineno or child.lineno) - child.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        yield name, length
                yield from walk(child, name + ".")
            else:
                yield from walk(child, prefix)

    yield from walk(module.tree, "")


def import_circles(modules: dict[str, Module]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(sorted(modules[root].imports)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(modules[child].imports))))
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
                    circles.append(sorted(component))
    return circles


def upward_imports(modules: dict[str, Module]) -> list[str]:
    """Each import of a module on the same floor (another package) or above, as `importer -> imported`."""
    found = []
    for module in modules.values():
        floor = FLOOR_OF[module.part]
        for name in sorted(module.imports):
            other = modules[name].part
            if other != module.part and FLOOR_OF[other] >= floor:
                found.append(f"{module.name} -> {name}")
    return found


# -- the tests --------------------------------------------------------------------------------------------------


def test_every_package_has_its_floor() -> None:
    """A new package or top-level module is given its floor here (and in docs/architecture.md) before it lands."""
    parts = {m.part for m in read_modules().values()}
    assert parts - set(FLOOR_OF) == set(), "add it to FLOORS"
    assert set(FLOOR_OF) - parts == set(), "FLOORS names what no longer exists"


def test_no_module_over_400_lines() -> None:
    too_long = {m.name: m.lines for m in read_modules().values() if m.lines > MAX_MODULE_LINES}
    assert too_long == {}


def test_no_function_over_60_lines() -> None:
    too_long = {f"{m.name}.{name}": n for m in read_modules().values() for name, n in long_functions(m)}
    assert too_long == {}


def test_no_import_circle() -> None:
    assert import_circles(read_modules()) == []


def test_every_floor_imports_only_the_floors_below() -> None:
    assert upward_imports(read_modules()) == []


def test_rules_import_nothing_above_them() -> None:
    """rules/ is the pure floor: what a rule needs from a protocol, the config or the sender comes in as data."""
    modules = read_modules()
    above = [f"{m.name} -> {n}" for m in modules.values() if m.part == "rules" for n in m.imports
             if FLOOR_OF[modules[n].part] >= FLOOR_OF["rules"] and modules[n].part != "rules"]
    assert above == []


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """Each check finds what it looks for: a circle, an upward import, a long function."""
    tree = ast.parse("def f():\n" + "    x = 1\n" * 70)
    module = Module("proxy_addon.rules.made_up", tmp_path / "made_up.py", 71, tree)
    assert list(long_functions(module)) == [("f", 71)]
    a = Module("proxy_addon.rules.a", tmp_path / "a.py", 1, ast.parse(""), {"proxy_addon.store.b"})
    b = Module("proxy_addon.store.b", tmp_path / "b.py", 1, ast.parse(""), {"proxy_addon.rules.a"})
    assert import_circles({a.name: a, b.name: b}) == [[a.name, b.name]]
    assert upward_imports({a.name: a, b.name: b}) == ["proxy_addon.rules.a -> proxy_addon.store.b"]
    typed = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from proxy_addon.store import b\n")
    c = Module("proxy_addon.rules.c", tmp_path / "c.py", 3, typed)
    assert set(imported(c, {b.name: b, c.name: c})) == {b.name}


# -- the counts ---------------------------------------------------------------------------------------------------


def counts() -> list[str]:
    modules = read_modules()
    lines = [f"modules: {len(modules)}, {sum(m.lines for m in modules.values())} lines"]
    big = sorted(((m.lines, m.name) for m in modules.values() if m.lines > MAX_MODULE_LINES), reverse=True)
    lines.append(f"modules over {MAX_MODULE_LINES} lines: {len(big)}" + "".join(f"\n  {n} {name}" for n, name in big))
    long = sorted(((n, f"{m.name}.{name}") for m in modules.values() for name, n in long_functions(m)), reverse=True)
    lines.append(f"functions over {MAX_FUNCTION_LINES} lines: {len(long)}" + "".join(f"\n  {n} {name}" for n, name in long))
    circles = import_circles(modules)
    lines.append(f"import circles: {len(circles)}" + "".join(f"\n  {' <-> '.join(c)}" for c in circles))
    known = {name: m for name, m in modules.items() if m.part in FLOOR_OF}
    unknown = sorted({m.part for m in modules.values() if m.part not in FLOOR_OF})
    upward = upward_imports(known) if not unknown else []
    lines.append(f"imports against the floors: {len(upward)}" + "".join(f"\n  {u}" for u in upward))
    rules_up = [u for u in upward if u.startswith("proxy_addon.rules.")]
    lines.append(f"  of them from rules/: {len(rules_up)}")
    if unknown:
        lines.append(f"packages without a floor: {', '.join(unknown)}")
    return lines


if __name__ == "__main__":
    if len(sys.argv) > 1:
        PACKAGE = Path(sys.argv[1]).resolve() / "proxy_addon"
    print("\n".join(counts()))
