"""Reads, parses and verifies the source of one Python function (file line numbers kept)."""
from __future__ import annotations

import __future__
import ast
import inspect
import linecache
import types
from dataclasses import dataclass, field
from typing import Any, Callable

from dycl_jax.errors import DyclError, Location

# compiler flags of `from __future__ import ...`; code objects carry them in co_flags
FUTURE_MASK = 0
for _name in __future__.all_feature_names:
    FUTURE_MASK |= getattr(__future__, _name).compiler_flag


@dataclass
class FunctionSource:
    """A parsed function whose AST line numbers are the lines of its file."""

    fn: types.FunctionType
    file: str
    tree: ast.FunctionDef  # decorators removed, line numbers of the file
    file_lines: list[str] = field(repr=False)
    class_name: str | None  # the class whose body defines it (name mangling, super())
    future_flags: int = 0
    dropped_decorators: list[int] = field(default_factory=list)  # lines of decorators not kept

    @property
    def qualname(self) -> str:
        return self.fn.__qualname__

    @property
    def line(self) -> int:
        return self.tree.lineno

    @property
    def self_name(self) -> str | None:
        """The method's first parameter (`self`) where a class defines it. Read from the function
        itself: a tree a converter made from it (an island, parameters sorted) has others first."""
        code = self.fn.__code__
        return code.co_varnames[0] if self.class_name and code.co_argcount else None

    def location(self, line: int) -> Location:
        code = self.file_lines[line - 1] if 0 < line <= len(self.file_lines) else ""
        return Location(self.file, line, code.rstrip("\n"))


def unwrap(fn: Callable[..., Any]) -> types.FunctionType:
    """The plain function behind bound methods and functools.wraps decorators."""
    fn = getattr(fn, "__func__", fn)
    seen = set()
    while hasattr(fn, "__wrapped__") and id(fn) not in seen:
        seen.add(id(fn))
        fn = fn.__wrapped__
        fn = getattr(fn, "__func__", fn)
    if not isinstance(fn, types.FunctionType):
        raise DyclError(f"{fn!r} is not a Python function, so its source cannot be rewritten")
    return fn


def _unreadable(fn: types.FunctionType, why: str) -> DyclError:
    code = fn.__code__
    return DyclError(
        f"cannot read the source of {fn.__qualname__} ({why}); dycl_jax rewrites control flow from source",
        location=Location(code.co_filename, code.co_firstlineno),
        fix="move the class (or function) into a .py file and import it from there, instead of "
        "defining it with exec(), `python -c` or an interactive prompt",
    )


def class_name_of(fn: types.FunctionType) -> str | None:
    """The innermost class in the qualified name, e.g. 'Block' for 'make.<locals>.Block.forward'."""
    parts = fn.__qualname__.split(".")
    if len(parts) >= 2 and parts[-2] != "<locals>":
        return parts[-2]
    return None


def read_function(fn: Callable[..., Any]) -> FunctionSource:
    """Parse `fn`'s source and check it is the code Python is running."""
    fn = unwrap(fn)
    code = fn.__code__
    if code.co_name == "<lambda>":
        raise DyclError(f"{fn.__qualname__} is a lambda; only `def` functions are rewritten")
    try:
        lines, start = inspect.getsourcelines(fn)
    except (OSError, TypeError) as exc:
        raise _unreadable(fn, str(exc) or type(exc).__name__) from None
    file = inspect.getsourcefile(fn) or code.co_filename
    text = "".join(lines)
    # parsing under `if 1:` accepts the indented body of a method without touching the
    # indentation inside multi-line strings (textwrap.dedent would)
    indented = text[:1].isspace()
    try:
        module = ast.parse("if 1:\n" + text if indented else text)
    except SyntaxError as exc:
        raise _unreadable(fn, f"its source text does not parse: {exc.msg}") from None
    body = module.body[0].body if indented else module.body
    defs = [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not defs:
        raise _unreadable(fn, "no `def` found in its source text")
    tree = defs[0]
    if isinstance(tree, ast.AsyncFunctionDef):
        raise DyclError(f"{fn.__qualname__} is an async function; it cannot be converted",
                        location=Location(file, start))
    ast.increment_lineno(module, start - 2 if indented else start - 1)
    file_lines = linecache.getlines(file) or lines
    src = FunctionSource(fn, file, tree, file_lines, class_name_of(fn), code.co_flags & FUTURE_MASK)
    verify(src)
    src.dropped_decorators = [d.lineno for d in tree.decorator_list]
    tree.decorator_list = []
    return src


_IMPORTS: dict[str, frozenset[str]] = {}


def module_imports(file: str) -> frozenset[str]:
    """Names bound by import statements at module level (CPython compiles method calls on
    them differently: `torch.relu(x)` is LOAD_ATTR + CALL, not LOAD_METHOD)."""
    if file not in _IMPORTS:
        names: set[str] = set()
        try:
            stack: list[ast.AST] = list(ast.parse("".join(linecache.getlines(file))).body)
        except (SyntaxError, ValueError):
            stack = []
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
            elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                stack.extend(ast.iter_child_nodes(node))
        _IMPORTS[file] = frozenset(names)
    return _IMPORTS[file]


def import_stubs(file: str, at: ast.AST) -> list[ast.stmt]:
    """`import <name>` for every module-level import of `file` (compiled, never executed)."""
    return [ast.copy_location(ast.Import(names=[ast.alias(name=n)]), at) for n in sorted(module_imports(file))]


def compile_in_context(tree: ast.FunctionDef, freevars: tuple[str, ...], class_name: str | None,
                       filename: str, flags: int, extra_params: tuple[str, ...] = ()) -> types.CodeType:
    """Compile a function definition in the scope it came from and return its code object.

    A factory function provides the closure variables, a class named like the original
    reproduces name mangling and the `__class__` cell of zero-argument super(), and import
    stubs reproduce how the module's imported names are called.
    """
    outer_params = [v for v in (*extra_params, *freevars) if v != "__class__"]
    inner: ast.stmt = tree
    if class_name is not None:
        inner = ast.ClassDef(name=class_name, bases=[], keywords=[], body=[tree], decorator_list=[])
    factory = ast.FunctionDef(
        name="_dycl_factory",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=p) for p in outer_params], kwonlyargs=[],
                           kw_defaults=[], defaults=[]),
        body=[inner], decorator_list=[], returns=None,
    )
    module = ast.Module(body=[*import_stubs(filename, tree), factory], type_ignores=[])
    for node in ast.walk(module):  # the wrappers sit on the function's own first line
        if not hasattr(node, "lineno") or node in (factory, inner):
            ast.copy_location(node, tree)
    ast.fix_missing_locations(module)
    code = compile(module, filename, "exec", flags=flags, dont_inherit=True)
    return find_code(code, tree.name)


def find_code(code: types.CodeType, name: str) -> types.CodeType:
    """The code object named `name` inside the factory (and class body) of `compile_in_context`."""
    stack = [c for c in code.co_consts if isinstance(c, types.CodeType)]
    while stack:
        c = stack.pop(0)
        if c.co_name == name and c.co_name != "_dycl_factory":
            return c
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    raise AssertionError(f"compiled code for {name} not found")


def _same_code(a: types.CodeType, b: types.CodeType) -> bool:
    if (a.co_code, a.co_names, a.co_varnames, a.co_freevars, a.co_cellvars, a.co_argcount,
            a.co_kwonlyargcount, a.co_posonlyargcount, a.co_firstlineno) != (
            b.co_code, b.co_names, b.co_varnames, b.co_freevars, b.co_cellvars, b.co_argcount,
            b.co_kwonlyargcount, b.co_posonlyargcount, b.co_firstlineno):
        return False
    if [ln for _, _, ln in a.co_lines()] != [ln for _, _, ln in b.co_lines()]:
        return False
    if len(a.co_consts) != len(b.co_consts):
        return False
    for x, y in zip(a.co_consts, b.co_consts):
        if isinstance(x, types.CodeType) or isinstance(y, types.CodeType):
            if not (isinstance(x, types.CodeType) and isinstance(y, types.CodeType) and _same_code(x, y)):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def verify(src: FunctionSource) -> None:
    """Recompile the parsed source and compare it with the live code object.

    inspect.getsource reads the file as it is now; if it changed after the import, the text
    no longer matches the running code. Bytecode, names, constants and the line table of a
    recompilation match only if the text is the one that was compiled.
    """
    code = src.fn.__code__
    try:
        again = compile_in_context(src.tree, code.co_freevars, src.class_name, code.co_filename,
                                   src.future_flags)
    except SyntaxError:
        again = None
    if again is None or not _same_code(again, code):
        raise DyclError(
            f"the source of {src.qualname} in {src.file} does not match the code Python is running "
            "(the file changed after it was imported)",
            location=src.location(code.co_firstlineno),
            fix="re-import the module (or restart the interpreter) so the running code matches the file",
        )
