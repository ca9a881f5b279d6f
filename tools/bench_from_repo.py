"""Benchmark `mlx-rlaif data from-repo` on real libraries from their source distributions.

For each NAME: `pip download --no-binary :all: --no-deps NAME` (or an sdist path given as
NAME=PATH), unpacked into a temporary directory (read-only to the run: the sandbox binds it so),
then `mlx-rlaif data from-repo` on it, then every kept task's reference run through
`mlx-rlaif score --reward exec` on its own. Reported per library: functions found (module-level,
outside the tests), functions the tests called, tasks kept, the mutation score distribution of
the kept tasks, the build's wall time, and the reference pass rate (must be 100%).

    python tools/bench_from_repo.py inflection toolz humanize --python /path/to/venv/bin/python \\
        [--max-mutants 20] [--out-dir DIR] [--markdown FILE] [--uid-base N]

`--python` names the interpreter with the libraries' test dependencies (pytest, and e.g.
freezegun for humanize). Not a test: it downloads, and it takes minutes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path


def sdist(name: str, cache: Path) -> Path:
    if "=" in name:
        return Path(name.split("=", 1)[1])
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                    "-q", "-d", str(cache), name], check=True)
    key = name.lower().replace("-", "_")
    hits = [p for p in cache.glob("*.tar.gz") if p.name.lower().replace("-", "_").startswith(key)]
    if not hits:
        raise SystemExit(f"{name}: no sdist downloaded into {cache}")
    return max(hits, key=lambda p: p.stat().st_mtime)


def unpack(archive: Path, into: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    (root,) = [p for p in into.iterdir() if p.is_dir()]
    return root


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", *args], capture_output=True,
                          text=True)


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def bench_one(name: str, args: argparse.Namespace, work: Path) -> dict:
    archive = sdist(name, work / "sdists")
    repo = unpack(archive, Path(tempfile.mkdtemp(prefix="bench-src-", dir=work)))
    out = work / f"{repo.name}.jsonl"
    cmd = ["data", "from-repo", str(repo), "--out", str(out), "--max-mutants",
           str(args.max_mutants), "--timeout", str(args.timeout)]
    if args.python:
        cmd += ["--python", args.python]
    uids = ["--set", f"reward.exec.uid_base={args.uid_base}"]
    cmd += uids
    t0 = time.monotonic()
    r = cli(*cmd)
    seconds = time.monotonic() - t0
    print(r.stdout, r.stderr, sep="", file=sys.stderr)
    if r.returncode != 0:
        return {"library": repo.name, "error": r.stderr.strip().splitlines()[-1:]}
    summary = json.loads(out.with_name(out.stem + ".summary.json").read_text())
    tasks = lines(out) + lines(out.with_name(out.stem + ".eval.jsonl"))
    refs = work / f"{repo.name}.refs.jsonl"
    refs.write_text("".join(json.dumps({**t, "completion": t["solution"]}) + "\n"
                            for t in tasks))
    scored = work / f"{repo.name}.scored.jsonl"
    s = cli("score", "--file", str(refs), "--out", str(scored), "--reward", "exec", *uids)
    if s.returncode != 0:
        raise SystemExit(s.stderr)
    passed = sum(o["details"].get("passed") == o["details"].get("total") and o["reward"]
                 is not None for o in lines(scored))
    return {"library": repo.name, "sdist": archive.name, **summary,
            "wall_seconds": round(seconds, 1), "references": len(tasks),
            "references_passed": passed}


def markdown(rows: list[dict]) -> str:
    head = ("| library | functions found | called by tests | tasks kept | mutation score of kept "
            "tasks (min / median / mean) | kept per score tenth | build time | reference pass "
            "rate |\n|---|---|---|---|---|---|---|---|\n")
    body = []
    for r in rows:
        if "error" in r:
            body.append(f"| {r['library']} | error: {r['error']} | | | | | | |")
            continue
        d = r["kept_mutation_scores"]
        dist = (f"{d['min']:.2f} / {d['median']:.2f} / {d['mean']:.2f}" if d.get("n") else "-")
        hist = " ".join(f"{k}: {v}" for k, v in d.get("histogram", {}).items() if v) or "-"
        rate = r["references_passed"] / r["references"] if r["references"] else 0.0
        body.append(f"| {r['library']} | {r['functions_found']} | {r['called']} | {r['kept']} | "
                    f"{dist} | {hist} | {r['wall_seconds']:.0f} s | "
                    f"{r['references_passed']}/{r['references']} ({rate:.0%}) |")
    return head + "\n".join(body) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="+", help="PyPI names, or NAME=path/to/sdist.tar.gz")
    p.add_argument("--python", default="", help="interpreter with the tests' dependencies")
    p.add_argument("--max-mutants", type=int, default=20)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out-dir", type=Path, default=None)
    p.add_argument("--uid-base", type=int, default=64000,
                   help="reward.exec.uid_base: as root, a uid range no other sandbox user shares")
    p.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    args = p.parse_args()
    work = (args.out_dir or Path(tempfile.mkdtemp(prefix="bench-from-repo-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o755)
    rows = [bench_one(n, args, work) for n in args.names]
    (work / "bench.json").write_text(json.dumps(rows, indent=2) + "\n")
    table = markdown(rows)
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    print(f"results: {work / 'bench.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
