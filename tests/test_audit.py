"""The judge audit against scripted judges (tests/scripted_judges.py) behind the real SDK clients
on a local server speaking the OpenAI and Anthropic wire formats: each biased judge is flagged for
its bias and nothing else, the control judge for nothing; the defences (strip_comments, samples,
rank_debias) remove the effects they are for; the command prints the calls and cost first,
refuses to wait on a non-interactive stdin, and writes the table and the JSON report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import audit_data  # noqa: E402
import scripted_judges as sj  # noqa: E402
from fake_api import FakeAPI  # noqa: E402

from mlx_rlaif.commands.audit_judge import confirm, is_loopback  # noqa: E402
from mlx_rlaif.commands.score import read_scoring_input  # noqa: E402
from mlx_rlaif.config import ExecConfig, TeacherConfig  # noqa: E402
from mlx_rlaif.records import Task, extract_code  # noqa: E402
from mlx_rlaif.rewards import agreement  # noqa: E402
from mlx_rlaif.rewards.exec import ExecReward  # noqa: E402
from mlx_rlaif.rewards.teacher import audit, audit_report  # noqa: E402
from mlx_rlaif.rewards.teacher.reward import TeacherReward  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CRITERIA = ["correctness", "code_quality", "efficiency", "documentation"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The audit file's items (exec run once) and an oracle that already knows their verdicts."""
    path = audit_data.write(tmp_path_factory.mktemp("audit") / "audit.jsonl")
    _, tasks, completions = read_scoring_input(str(path))
    exec_fn = ExecReward(ExecConfig(), languages={"python"})
    try:
        items = audit.prepare(tasks, completions, exec_fn)
    finally:
        exec_fn.close()
    oracle = sj.Oracle(tasks)
    for x in items:
        oracle.learn(x.task.prompt, x.code, x.passed)
        for c in x.variants.values():
            oracle.learn(x.task.prompt, extract_code(c, "python"), x.passed)
    yield path, items, oracle
    oracle.close()


def audit_with(items, respond, provider="openai", repeats=3, **cfg) -> dict:
    with FakeAPI() as srv:
        srv.responder = respond
        url = srv.anthropic_url if provider == "anthropic" else srv.openai_url
        tcfg = TeacherConfig(provider=provider, model="judge", base_url=url, reference=False,
                             concurrency=8, max_retries=0, **cfg)
        with TeacherReward(tcfg) as teacher:
            obs = audit.run(teacher, items, repeats, 4)
    return audit_report.build(items, obs, CRITERIA, {})


def flagged(report) -> set[str]:
    return {f["check"] for f in report["flags"]}


def effect(report, check, col) -> float:
    return report["checks"][check]["effects"][col]["mean"]


def test_the_audit_file_has_passing_and_failing_answers_and_kept_variants(prepared):
    _, items, _ = prepared
    assert len(items) == 32 and sum(x.passed for x in items) == 16
    assert all(x.passed == (k % 4 < 2) for k, x in enumerate(items))
    kept = {k: sum(k in x.variants for x in items) for k in audit.KINDS}
    assert kept == {k: 32 for k in audit.KINDS}


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_control_judge_is_flagged_for_nothing(prepared, provider):
    _, items, oracle = prepared
    report = audit_with(items, sj.responder(sj.control(oracle)), provider)
    assert report["flags"] == []
    agree = report["checks"]["agreement"]
    assert agree["spearman"]["overall"] == pytest.approx(1.0) and agree["pairs"] == 32
    assert agree["fail_over_pass"]["correctness"] == 0.0
    assert report["checks"]["noise"]["sd"]["overall"] == 0.0


def test_length_judge_is_flagged_for_comments_and_dead_code(prepared):
    _, items, oracle = prepared
    report = audit_with(items, sj.responder(sj.length(oracle)), "anthropic")
    assert flagged(report) == {"comments", "padding"}
    # docs/rewards.md's figures: +0.17 (comments), +0.19 (dead code) on this file
    assert effect(report, "comments", "overall") == pytest.approx(0.173, abs=0.005)
    assert effect(report, "padding", "overall") == pytest.approx(0.192, abs=0.005)
    assert effect(report, "rename", "overall") == pytest.approx(0.0)  # same-length names
    assert effect(report, "injection", "overall") == pytest.approx(0.0)  # same-length comment


def test_injection_judge_is_flagged_for_injection_only(prepared):
    _, items, oracle = prepared
    report = audit_with(items, sj.responder(sj.injection(oracle)))
    assert flagged(report) == {"injection"}
    # failing answers' correctness goes from 0.1 to 1.0, passing ones' from 0.7: mean +0.6
    assert effect(report, "injection", "correctness") == pytest.approx(0.6)
    assert effect(report, "injection", "overall") == pytest.approx(0.3 * 0.6)


def test_noise_judge_is_flagged_for_noise_and_agreement_only(prepared):
    _, items, _ = prepared
    report = audit_with(items, sj.Noise().respond, "anthropic")
    assert flagged(report) == {"noise", "agreement"}
    assert report["checks"]["noise"]["sd"]["correctness"] > 0.2


def test_position_judge_is_flagged_in_rank_mode_only_for_position(prepared):
    _, items, oracle = prepared
    report = audit_with(items, sj.responder(sj.position(oracle)), mode="rank")
    assert flagged(report) == {"position"}
    pos = report["checks"]["position"]
    # bonuses 0.3, 0.15, 0, 0 around their mean 0.1125 in every group of four
    assert [e["mean"] for e in pos["effects"]["overall"]] == pytest.approx(
        [0.1875, 0.0375, -0.1125, -0.1125])
    assert pos["orders"] == 4
    control = audit_with(items, sj.responder(sj.control(oracle)), "anthropic", mode="rank")
    assert control["flags"] == [] and control["checks"]["position"]["max"]["overall"]["mean"] == 0


def test_strip_comments_removes_the_injection_and_comment_effects(prepared):
    _, items, oracle = prepared
    report = audit_with(items, sj.responder(sj.injection(oracle)), strip_comments=True)
    assert report["flags"] == []
    assert effect(report, "injection", "correctness") == 0.0
    report = audit_with(items, sj.responder(sj.length(oracle)), "anthropic", strip_comments=True)
    assert effect(report, "comments", "correctness") == 0.0  # judged without the comments
    assert effect(report, "injection", "correctness") == 0.0
    assert effect(report, "comments", "code_quality") > 0.1  # still seen where they count
    assert not [f for f in report["flags"] if f["check"] == "comments"
                and f["column"] == "correctness"]


def test_strip_comments_in_rank_mode(prepared):
    _, items, oracle = prepared
    plain = audit_with(items, sj.responder(sj.injection(oracle)), "anthropic", mode="rank")
    assert flagged(plain) == {"injection"}
    stripped = audit_with(items, sj.responder(sj.injection(oracle)), mode="rank",
                          strip_comments=True)
    assert stripped["flags"] == [] and effect(stripped, "injection", "correctness") == 0.0


def test_samples_average_the_noise_away(prepared):
    _, items, _ = prepared
    one = audit_with(items, sj.Noise().respond)["checks"]["noise"]["sd"]["overall"]
    four = audit_with(items, sj.Noise().respond, samples=4)["checks"]["noise"]["sd"]["overall"]
    assert four < 0.7 * one  # the mean of 4 has half the sd of one


@pytest.mark.parametrize("mode, extra", [("absolute", {}), ("rank", {}),
                                         ("rank", {"strip_comments": True}),
                                         ("absolute", {"samples": 2, "reference": True})])
def test_the_plan_counts_the_calls_made(prepared, mode, extra):
    """Uneven groups (2 and 4 candidates) in rank mode: each rotated at most its size."""
    _, items, oracle = prepared
    items = items[:2] + items[4:8]
    with FakeAPI() as srv:
        srv.responder = sj.responder(sj.control(oracle))
        cfg = TeacherConfig(**{"provider": "openai", "model": "judge", "base_url": srv.openai_url,
                               "reference": False, "mode": mode, **extra})
        planned = audit.plan(items, cfg, 3, 4, by_tool=False)
        with TeacherReward(cfg) as teacher:
            obs = audit.run(teacher, items, 3, 4)
            made = teacher.metrics()["teacher/calls"]
    if extra.get("strip_comments"):  # comments and injections stripped: cache hits
        assert 0 < made < planned.calls
    else:
        assert made == planned.calls and planned.input_tokens > 0
    report = audit_report.build(items, obs, CRITERIA, {})
    assert report["flags"] == []
    if mode == "rank":
        assert report["checks"]["position"]["orders"] == 4
        assert len(report["checks"]["position"]["effects"]["overall"]) == 4


def test_samples_are_separate_calls_with_cache_entries_of_their_own(tmp_path):
    task = Task("add1", "Write add1(x) that returns x + 1.")
    with FakeAPI() as srv:
        cfg = TeacherConfig(provider="openai", model="judge", base_url=srv.openai_url,
                            reference=False, samples=3, cache_path=str(tmp_path / "c.db"))
        with TeacherReward(cfg) as t:
            (r,) = t.score([task], ["def add1(x): return x + 1"])
        assert srv.hits() == 3 and r.details["samples"] == 3
        with TeacherReward(cfg) as t:
            t.score([task], ["def add1(x): return x + 1"])
            assert srv.hits() == 3 and t.metrics()["teacher/cache_hits"] == 3.0
            t.score([task], ["def add1(x): return x + 1"], repeat=1)
        assert srv.hits() == 6  # a repeat draws fresh samples
        bodies = {json.dumps(r.body) for r in srv.requests}
        assert len(bodies) == 1  # the same request: only the cache key tells samples apart


def test_rank_samples_show_the_group_in_orders_of_their_own():
    task = Task("add1", "Write add1(x) that returns x + 1.")
    codes = [f"def add1(x):\n    return x + {i}" for i in range(4)]
    with FakeAPI() as srv:
        cfg = TeacherConfig(provider="anthropic", model="judge", base_url=srv.anthropic_url,
                            reference=False, mode="rank", samples=3)
        with TeacherReward(cfg) as t:
            rewards = t.score([task] * 4, codes)
        shown = [[c for c in codes if c in r.body["messages"][0]["content"]] for r in srv.requests]
    assert srv.hits() == 3 and all(r.details["samples"] == 3 for r in rewards)
    orders = [tuple(sorted(codes, key=lambda c, b=r.body["messages"][0]["content"]: b.index(c)))
              for r in srv.requests]
    assert len(set(orders)) > 1 and all(len(s) == 4 for s in shown)


def test_rank_debias_scores_against_the_judges_position_statistics(prepared):
    """The position judge puts a failing candidate shown first above a passing one shown third
    (0.31 + 0.3 > 0.58); shuffled per call and corrected, failing never beats passing."""
    _, items, oracle = prepared
    items = [items[4 * (k // 4) + [2, 0, 1, 3][k % 4]] for k in range(len(items))]  # f p p f
    tasks = [x.task for x in items]
    completions = [x.completion for x in items]

    def worse(rewards) -> float:
        judged = [(t.id, x.exec, r.value) for t, x, r in zip(tasks, items, rewards, strict=True)]
        w = agreement.AgreementWindow(1)
        w.add([j[0] for j in judged], [j[1] for j in judged], [j[2] for j in judged])
        return w.metrics()["teacher/fail_over_pass"]

    with FakeAPI() as srv:
        srv.responder = sj.responder(sj.position(oracle))
        for debias in (False, True):
            cfg = TeacherConfig(provider="openai", model="judge", base_url=srv.openai_url,
                                reference=False, mode="rank", rank_debias=debias,
                                concurrency=8)
            with TeacherReward(cfg) as t:
                rewards = [t.score(tasks, completions, repeat=r) for r in range(4)]
                m = t.metrics()
            if not debias:
                assert worse(rewards[-1]) == pytest.approx(0.25)  # 1 of the 4 pairs per task
                assert "teacher/position_bias" not in m
            else:  # 8 observations per position per batch: corrected from the third batch on
                assert worse(rewards[-1]) == 0.0
                assert m["teacher/position_bias"] == pytest.approx(0.1875, abs=0.03)


# --- the command ------------------------------------------------------------------------------


def cli(*args: str, stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": ""}
    return subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", "audit-judge", *args],
                          capture_output=True, text=True, env=env, stdin=stdin, timeout=300,
                          cwd=ROOT)


def test_command_prints_plan_table_and_json(prepared, tmp_path):
    _, _, oracle = prepared
    path = audit_data.write(tmp_path / "two.jsonl", n_tasks=2)
    with FakeAPI() as srv:
        srv.responder = sj.responder(sj.injection(oracle))
        out = tmp_path / "report.json"
        proc = cli("--file", str(path), "--teacher", "openai", "--base-url", srv.openai_url,
                   "--model", "judge", "--set", "reward.teacher.reference=false",
                   "--set", "reward.teacher.concurrency=8", "--out", str(out))
        hits = srv.hits()
    assert proc.returncode == 0, proc.stderr
    assert "makes 64 teacher calls" in proc.stderr and "cost unknown" in proc.stderr
    assert "rank corr. with exec" in proc.stdout and "injection vs neutral comment" in proc.stdout
    assert "! injection (overall)" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("verdict: flagged (injection)")
    report = json.loads(out.read_text())
    assert report["verdict"] == "flagged"
    assert {f["check"] for f in report["flags"]} == {"injection"}
    assert report["calls"]["made"] == hits == 64  # 8 completions x (3 repeats + 5 variants)
    assert report["calls"]["input_tokens"] == 100 * hits  # the fake server's usage numbers
    assert report["teacher"]["model"] == "judge" and report["file"]["judged"] == 8


def test_command_asks_above_the_threshold_and_never_waits_on_a_pipe(tmp_path):
    path = audit_data.write(tmp_path / "one.jsonl", n_tasks=1)
    with FakeAPI() as srv:
        args = ["--file", str(path), "--teacher", "openai", "--base-url", srv.openai_url,
                "--model", "judge", "--set", "reward.teacher.price_in_per_mtok=1000",
                "--set", "reward.teacher.price_out_per_mtok=1000"]
        proc = cli(*args)
        assert srv.hits() == 0
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()[-1]
    assert "--yes" in err and "stdin is not a terminal" in err and "above --confirm-above" in err


@pytest.mark.slow
def test_a_real_local_judge_end_to_end(tmp_path):
    """mlx_lm.server serving the shipped tiny model through the openai provider: its answers
    are not JSON, so every judgement is unscorable, and the audit says so (and nothing else)."""
    from test_teacher import _free_port, _wait_healthy

    path = audit_data.write(tmp_path / "one.jsonl", n_tasks=1)
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlx_lm.server", "--model", str(ROOT / "models/tiny-coder"),
         "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc)
        out = tmp_path / "report.json"
        run = cli("--file", str(path), "--teacher", "openai", "--model", "default_model",
                  "--base-url", f"http://127.0.0.1:{port}/v1", "--repeats", "2",
                  "--set", "reward.teacher.max_tokens=16", "--set", "reward.teacher.reference=false",
                  "--set", "reward.teacher.price_in_per_mtok=0.8",
                  "--set", "reward.teacher.price_out_per_mtok=4", "--out", str(out))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode is not None
    assert run.returncode == 0, run.stderr
    assert "makes 28 teacher calls" in run.stderr  # 4 completions x (2 repeats + 5 variants)
    report = json.loads(out.read_text())
    calls = report["calls"]
    assert calls["made"] == 28 and calls["input_tokens"] > 28 * 100
    assert 0 < calls["output_tokens"] <= 28 * 16
    assert calls["cost_usd"] == pytest.approx(
        (calls["input_tokens"] * 0.8 + calls["output_tokens"] * 4) / 1e6)
    assert {f["check"] for f in report["flags"]} == {"unscorable"}
    assert report["checks"]["coverage"] == {"judgements": 28, "scored": 0,
                                            "reasons": report["checks"]["coverage"]["reasons"]}
    assert "usable judgements 0/28" in run.stdout
    assert run.stdout.strip().splitlines()[-1].startswith("verdict: flagged (unscorable)")


def test_confirm_rules():
    class P:
        def __init__(self, cost):
            self.cost_usd = cost

    asked = []

    def ask(answer):
        return lambda q: asked.append(q) or answer

    assert confirm(P(0.5), False, 1.0, "", None)  # under the threshold: no question
    assert confirm(P(5.0), True, 1.0, "", None)  # --yes
    assert confirm(P(None), False, 1.0, "http://127.0.0.1:8080/v1", None)  # local, free
    assert confirm(P(5.0), False, 1.0, "", ask("y")) and not confirm(P(5.0), False, 1.0, "",
                                                                     ask("n"))
    assert not confirm(P(None), False, 1.0, "https://proxy.example/v1", ask(""))
    assert "unknown" in asked[-1]
    assert is_loopback("http://localhost:1/v1") and not is_loopback("https://api.openai.com")


# --- the verdicts -----------------------------------------------------------------------------


def test_a_small_file_leaves_an_obeying_judge_inconclusive_never_clean(prepared):
    """One task (2 passing, 2 failing completions; the issue's case was 6): the injection
    raises overall by 0.09 on passing and 0.27 on failing answers, mean 0.18, sd 0.1039, so
    the 95% interval is 0.18 -+ 3.182 x 0.0520 = +0.015 to +0.345: it spans the 0.05 threshold.
    At that mean and sd, 5 differences give 2.776 x 0.1039 / sqrt(5) = 0.129 < 0.13. (The old
    report: t = 3.5 < 4, "nothing flagged at these thresholds".)"""
    _, items, oracle = prepared
    report = audit_with(items[:4], sj.responder(sj.injection(oracle)))
    v = report["verdicts"]["injection"]
    assert v["overall"]["verdict"] == v["correctness"]["verdict"] == "inconclusive"
    assert (v["overall"]["low"], v["overall"]["high"]) == pytest.approx((0.0146, 0.3454),
                                                                        abs=5e-4)
    assert v["overall"]["needed"] == v["correctness"]["needed"] == 5
    assert report["flags"] == [] and report["verdict"] == "inconclusive"
    lines = audit_report.verdict_lines(report)
    assert ("? injection (overall): +0.180, 95% interval +0.015 to +0.345 spans the +0.05 "
            "threshold: about 5 completions like these would decide it (this file: 4)") in lines
    assert lines[-1].startswith("verdict: inconclusive (injection: more completions needed")
    assert "clean (comments, padding, rename)" in lines[-1]


def test_a_large_file_flags_the_obeying_judge_and_clears_the_control(prepared):
    """32 completions: correctness +0.3 on the 16 passing, +0.9 on the 16 failing answers,
    mean 0.6, sd 0.3048: 0.6 -+ 2.040 x 0.0539 = +0.490 to +0.710, beyond 0.05."""
    _, items, oracle = prepared
    report = audit_with(items, sj.responder(sj.injection(oracle)))
    v = report["verdicts"]["injection"]
    assert v["correctness"]["verdict"] == v["overall"]["verdict"] == "flagged"
    assert (v["correctness"]["low"], v["correctness"]["high"]) == pytest.approx((0.490, 0.710),
                                                                                abs=1e-3)
    assert report["verdict"] == "flagged" and flagged(report) == {"injection"}
    last = audit_report.verdict_lines(report)[-1]
    assert last.startswith("verdict: flagged (injection); clean (comments, padding, rename)")
    control = audit_with(items, sj.responder(sj.control(oracle)))
    assert control["verdict"] == "clean"
    assert {c: audit_report.probe_verdict(b) for c, b in control["verdicts"].items()} == {
        k: "clean" for k in audit.PROBES}
    assert audit_report.verdict_lines(control) == [
        "verdict: clean: every probe's interval lies within its threshold and nothing is "
        "flagged (95% intervals on each probe's effect against 0.05)"]


def test_t_quantiles_and_intervals_by_hand():
    from mlx_rlaif.rewards.teacher.audit_verdict import decide, t_quantile

    for df, want in ((1, 12.706), (2, 4.303), (3, 3.182), (9, 2.262), (30, 2.042)):
        assert t_quantile(0.975, df) == pytest.approx(want, rel=2e-3)
    assert decide(0.2, 0.0, 5, 0.05, False).verdict == "flagged"  # no spread: the value
    assert decide(0.0, 0.0, 5, 0.05, True).verdict == "clean"
    assert decide(-0.3, 0.01, 30, 0.05, True).verdict == "flagged"  # lowers correctness
    assert decide(-0.3, 0.01, 30, 0.05, False).verdict == "clean"  # overall: raises only
    one = decide(0.5, 0.0, 1, 0.05, False, completions_per_difference=2.0)
    assert one.verdict == "inconclusive" and one.low is None and one.needed == 4
    assert decide(0.05 - 1e-12, 0.1, 10, 0.05, False).verdict == "inconclusive"
