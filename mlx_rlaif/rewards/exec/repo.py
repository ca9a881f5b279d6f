"""Repository tasks (`mlx-rlaif data from-repo`): the student's function put back into its module.

A repository task is a HumanEval-style task (format 1) whose record also holds `repo` (the
repository's path, the module's file, dotted name and import root, the function's name, the
module's source as recorded, the interpreter's import path). Two programs run, each in its own
sandbox of the exec reward, with the repository and the interpreter's packages readable and
nothing of them writable (bound read-only under bwrap; `Sandbox.also_read`):

- the student's side (`student_program`): the module's source with the one function replaced
  by the student's, served under the module's own name by an import hook, so the function
  runs with the module's globals and the repository's other modules importable; the harness's
  function server answers calls of it;
- the checker (`check_source`, generated when the task is built): imports the repository,
  replaces the function everywhere the repository's modules hold it by the candidate (the proxy
  to the student's process), and runs one test unit per recorded call (the arguments as Python
  literals, the result compared type-strictly, or the exception's type name) and one per
  repository test function that called it.

So the verdict stays the checker's, from plain data: the repository's own test functions run on
the trusted side and see only what crosses the wire.

Not covered: methods and nested functions (module-level functions only), tests that take
fixtures or parameters, repository code that keeps a reference to the original function where
the checker does not find it (a registry, a closure): such a test cannot tell a wrong answer
apart, and the mutation gate drops the task when that leaves it too weak.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from typing import Any

PREFIX = "_mlx_rlaif_"  # no leading "__": names in a class body would be mangled


def is_repo_task(meta: Mapping[str, Any]) -> bool:
    return isinstance(meta.get("repo"), Mapping) and "module" in meta["repo"]


def read_paths(repo: Mapping[str, Any]) -> list[str]:
    """The directories a repository task's sandboxes must read: the repository and the
    interpreter's import path (site-packages) recorded with it."""
    return [str(repo["path"]), *[str(p) for p in repo.get("sys_path", [])]]


def import_paths(repo: Mapping[str, Any]) -> list[str]:
    return [str(repo["root"]), *[str(p) for p in repo.get("sys_path", [])]]


def find_def(tree: ast.Module, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    return next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == name), None)


def source_lines(source: str) -> list[str]:
    """`source`'s lines as Python numbers them (ast's lineno): split at \\n, \\r\\n and \\r only,
    never at a form feed or another character `str.splitlines` also breaks at."""
    lines = re.split(r"\r\n|\r|\n", source)
    return lines[:-1] if lines and lines[-1] == "" else lines


def splice(module_source: str, name: str, code: str) -> str | None:
    """The module's source with its top-level function `name` (decorators kept) replaced by the
    definition of `name` in `code` (its own decorators dropped), the answer's top-level imports
    put before it. None when `code` parses but does not define `name`; `code` itself (so that
    the build reports the syntax error) when it does not parse."""
    try:
        answer = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return code
    new = find_def(answer, name)
    if new is None:
        return None
    original = find_def(ast.parse(module_source), name)
    if original is None:
        return None
    lines = source_lines(code)
    imports = [ast.get_source_segment(code, n) or "" for n in answer.body
               if isinstance(n, (ast.Import, ast.ImportFrom)) and getattr(n, "level", 0) == 0]
    body = "\n".join([*imports, *lines[new.lineno - 1:new.end_lineno]])
    src = source_lines(module_source)
    return "\n".join([*src[:original.lineno - 1], body, *src[original.end_lineno:]]) + "\n"


def student_program(repo: Mapping[str, Any], name: str, code: str) -> str:
    """The program the harness's function server loads for a repository task: the module, with
    the student's `name`, imported under its own name; `name` bound to its function."""
    source = splice(str(repo["source"]), name, code)
    if source is None:
        return f"raise NameError({f'the answer does not define {name}()'!r})\n"
    if source is code:
        return code  # does not parse: the build reports it
    module = str(repo["module"])
    is_pkg = str(repo["file"]).endswith("__init__.py")
    path = f"{repo['path']}/{repo['file']}"
    p = PREFIX
    return "\n".join([
        f"import sys as {p}sys, importlib.abc as {p}abc, importlib.util as {p}util",
        f"{p}sys.dont_write_bytecode = True",
        f"{p}sys.path[:0] = {import_paths(repo)!r}",
        f"class {p}Loader({p}abc.MetaPathFinder, {p}abc.Loader):",
        "    def find_spec(self, fullname, path=None, target=None):",
        f"        if fullname != {module!r}:",
        "            return None",
        f"        return {p}util.spec_from_loader(fullname, self, origin={path!r}, "
        f"is_package={is_pkg!r})",
        "    def create_module(self, spec):",
        "        return None",
        "    def exec_module(self, m):",
        f"        m.__file__ = {path!r}",
        f"        if {is_pkg!r}:",
        f"            m.__path__ = [{path.rsplit('/', 1)[0]!r}]",
        f"        exec(compile({source!r}, {path!r}, 'exec'), m.__dict__)",
        f"{p}sys.meta_path.insert(0, {p}Loader())",
        f"{name} = getattr(__import__({module!r}, fromlist=['_']), {name!r})",
        "",
    ])


# --- the checker's side --------------------------------------------------------------------------

_HELPERS = '''
def __same(got, want):
    if type(got) is not type(want):
        return False
    if type(want) is float:
        import math
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
    if type(want) in (list, tuple):
        return len(got) == len(want) and all(__same(a, b) for a, b in zip(got, want))
    if type(want) is dict:
        return got.keys() == want.keys() and all(__same(got[k], want[k]) for k in want)
    return got == want


def __raises(call, name):
    try:
        call()
    except Exception as e:
        if not type(e).__name__.startswith("Student"):
            raise
        return str(e).split(":", 1)[0] == name
    return False


def __setup(candidate):
    import importlib
    import sys
    sys.dont_write_bytecode = True
    sys.path[:0] = __PATHS
    module = importlib.import_module(__MODULE)
    original = getattr(module, __NAME)
    for m in list(sys.modules.values()):
        space = getattr(m, "__dict__", None)
        if not isinstance(space, dict) or not getattr(m, "__name__", "").startswith(__TOP):
            continue
        for key, value in list(space.items()):
            if value is original:
                space[key] = candidate


def __test(module, root, name):
    import importlib
    import sys
    if root not in sys.path:
        sys.path.insert(0, root)
    fn = getattr(importlib.import_module(module), name)
    try:
        fn()
    except TypeError as e:
        if "plain data" in str(e) and not type(e).__name__.startswith("Student"):
            raise AssertionError("the test passes values that are not plain data") from None
        raise
    return True
'''


def check_source(repo: Mapping[str, Any], name: str, calls: Sequence[Mapping[str, str]],
                 tests: Sequence[Sequence[str]]) -> str:
    """`check(candidate)` for a repository task: one assert (one test unit) per recorded call
    and per repository test function (module, import root, name)."""
    module = str(repo["module"])
    head = [f"__PATHS = {import_paths(repo)!r}", f"__MODULE = {module!r}",
            f"__NAME = {name!r}", f"__TOP = {module.split('.')[0]!r}", _HELPERS]
    body = ["def check(candidate):", "    __setup(candidate)"]
    for c in calls:
        call = f"candidate(*{c['args']}, **{c['kwargs']})"
        if "raises" in c:
            body.append(f"    assert __raises(lambda: {call}, {c['raises']!r})")
        else:
            body.append(f"    assert __same({call}, {c['returns']})")
    for t in tests:
        body.append(f"    assert __test({t[0]!r}, {t[1]!r}, {t[2]!r})")
    return "\n".join([*head, *body, ""])
