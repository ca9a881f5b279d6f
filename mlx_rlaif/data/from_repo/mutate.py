"""Simple mutants of one function: the quality gate's measure of how much its tests check.

A small AST mutator of our own (mutmut and cosmic-ray mutate whole files or modules through their
own runners and databases, and cannot be pointed at one function's text and our sandboxed
verdict). Each mutant changes one place of the function's body, the classic operators:

- arithmetic: + <-> -, * <-> /, // -> /, % -> *, ** -> *  (also in `x += ...`);
- comparisons: < <-> <=, > <-> >=, == <-> !=, in <-> not in, is <-> is not;
- boolean: and <-> or, `not x` -> `x`;
- constants: an int n -> n + 1, True <-> False, a non-empty string -> "", "" -> "X", None kept;
- a removed statement (replaced by `pass`), and `return X` -> `return None`.

The docstring is never mutated. Mutants are the whole `def` as source (ast.unparse), decorators
dropped (the task's module keeps the original's). Equivalent mutants exist (a change no input
can tell): they count as survivors, so the score is a lower bound of the tests' strength.
"""

from __future__ import annotations

import ast
import copy
import random
from collections.abc import Iterator

_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
        ast.FloorDiv: ast.Div, ast.Mod: ast.Mult, ast.Pow: ast.Mult}
_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
        ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot,
        ast.IsNot: ast.Is}
_BOOL = {ast.And: ast.Or, ast.Or: ast.And}


def _body_nodes(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AST]:
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                             ast.Constant):
        body = body[1:]  # the docstring
    for stmt in body:
        yield from ast.walk(stmt)


def _sites(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[int, str]]:
    """(node index in walk order, kind) of every place a mutant can change."""
    sites: list[tuple[int, str]] = []
    for i, node in enumerate(_body_nodes(fn)):
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BIN:
            sites.append((i, "binop"))
        elif isinstance(node, ast.Compare):
            sites += [(i, f"cmp{k}") for k, op in enumerate(node.ops) if type(op) in _CMP]
        elif isinstance(node, ast.BoolOp):
            sites.append((i, "bool"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            sites.append((i, "not"))
        elif isinstance(node, ast.Constant) and _const(node.value) is not None:
            sites.append((i, "const"))
        if isinstance(node, ast.Return) and node.value is not None and not (
                isinstance(node.value, ast.Constant) and node.value.value is None):
            sites.append((i, "return"))
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.Pass, ast.FunctionDef,
                                                                ast.ClassDef)):
            sites.append((i, "delete"))
    return sites


def _const(v: object) -> object | None:
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + 1
    if isinstance(v, str):
        return "" if v else "X"
    return None


class _Apply(ast.NodeTransformer):
    def __init__(self, target: ast.AST, kind: str):
        self.target, self.kind = target, kind

    def generic_visit(self, node):
        node = super().generic_visit(node)
        if node is not self.target:
            return node
        k = self.kind
        if k == "binop":
            node.op = _BIN[type(node.op)]()
        elif k.startswith("cmp"):
            j = int(k[3:])
            node.ops[j] = _CMP[type(node.ops[j])]()
        elif k == "bool":
            node.op = _BOOL[type(node.op)]()
        elif k == "not":
            return node.operand
        elif k == "const":
            node.value = _const(node.value)
        elif k == "return":
            node.value = ast.Constant(None)
        elif k == "delete":
            return ast.Pass()
        return node


def mutants(def_source: str, name: str, limit: int, seed: int = 0) -> list[str]:
    """Up to `limit` distinct mutants of the function `name` defined in `def_source`, as
    source, chosen at random (seeded) among every site; never the original."""
    tree = ast.parse(def_source)
    fn = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
              and n.name == name)
    fn.decorator_list = []
    original = ast.unparse(fn)
    sites = _sites(fn)
    random.Random(seed).shuffle(sites)
    out: list[str] = []
    for index, kind in sites:
        if len(out) >= limit:
            break
        clone = copy.deepcopy(fn)
        target = list(_body_nodes(clone))[index]
        mutated = _Apply(target, kind).visit(clone)
        try:
            text = ast.unparse(ast.fix_missing_locations(mutated))
            compile(text, "<mutant>", "exec")
        except (SyntaxError, ValueError, TypeError):
            continue
        if text != original and text not in out:
            out.append(text)
    return out


def blank_bodies(def_source: str, name: str) -> list[str]:
    """The function with its body (docstring kept) replaced by `pass`, `return None` and
    `raise NotImplementedError`: answers that must fail every kept task."""
    tree = ast.parse(def_source)
    fn = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
              and n.name == name)
    fn.decorator_list = []
    doc = fn.body[:1] if ast.get_docstring(fn) is not None else []
    out = []
    for stmt in ("pass", "return None", "raise NotImplementedError"):
        fn.body = [*doc, *ast.parse(stmt).body]
        out.append(ast.unparse(fn))
    return out
