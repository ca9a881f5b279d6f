"""The pytest node ids of a junit report's skipped tests whose reason names one of the words
given: `python3 .ci/skipped.py REPORT.xml torch peft` prints one id a line (CI re-runs them once
the missing packages are installed).

A module skipped whole at collection (`pytest.importorskip` at its top) is printed as its
file, so all of it runs again. Not covered: reasons that do not name the missing package."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def node_id(classname: str, name: str, root: Path) -> str:
    """`tests.test_x.TestY` + `test_z[p]` -> `tests/test_x.py::TestY::test_z[p]` (the module is
    the longest dotted prefix that is a file under `root`)."""
    if not classname:  # a module skipped whole: junit names it in `name`
        classname, name = name, ""
    parts = [x for x in classname.split(".") if x]
    for cut in range(len(parts), 0, -1):
        path = Path(*parts[:cut]).with_suffix(".py")
        if (root / path).is_file():
            return "::".join([path.as_posix(), *parts[cut:], *([name] if name else [])])
    return "::".join([*parts, *([name] if name else [])])


def skipped(report: Path, words: list[str], root: Path) -> list[str]:
    out: list[str] = []
    for case in ET.parse(report).iter("testcase"):
        skip = case.find("skipped")
        if skip is None:
            continue
        reason = f"{skip.get('message', '')} {skip.text or ''}"
        if any(w in reason for w in words):
            nid = node_id(case.get("classname", ""), case.get("name", ""), root)
            if nid not in out:
                out.append(nid)
    return out


if __name__ == "__main__":
    print("\n".join(skipped(Path(sys.argv[1]), sys.argv[2:], Path.cwd())))
