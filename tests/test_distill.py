"""Distillation (distill.kind teacher | self): the per-token term in the numpy reference objective
(hand-computed numbers) and the trainer's path against it, the teacher's tokenizer check at
load, the self-distillation context, the config's refusals, and a 2-step `mlx-rlaif train` run
of each kind writing distill/kl to batches.jsonl.

Not covered: whether distillation learns faster than GRPO (issue 58's measurements).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import reference_objective as ref
from conftest import TEST_DTYPE
from train_cli import command, run_cli

from mlx_rlaif.algo import distill as algo
from mlx_rlaif.algo.aggregation import aggregation_weights, loss_aggregation
from mlx_rlaif.backends.batch import build
from mlx_rlaif.config import batch_sequences, check, load
from mlx_rlaif.errors import ConfigError, UsageError
from mlx_rlaif.records import Reward, Rollout, Task
from mlx_rlaif.testing.randmodel import make_model_dir, make_tokenizer
from mlx_rlaif.train.distill import Terms, context, contexts
from mlx_rlaif.train.step import critic_targets, group_targets


def hand_batch() -> list[ref.Seq]:
    """One group of two: A (score 1) with two tokens, B (score 0) with one; the policy is the
    sampler (ratio 1)."""
    def seq(score: float, old: list[float], teacher: list[float]) -> ref.Seq:
        n = len(old)
        return ref.Seq(group=0, score=score, old=np.array(old), logp=np.array(old),
                       ref=np.array(old), mask=np.ones(n), entropy=np.ones(n),
                       teacher=np.array(teacher))
    return [seq(1.0, [-1.0, -2.0], [-0.5, -3.0]), seq(0.0, [-1.0], [-1.2])]


@pytest.mark.parametrize("clip, loss, grad", [
    # A_A = A_B = +-0.5 / 0.500001; d = 0.5 (teacher - old): A [0.25, -0.5], B [-0.1];
    # A_t = 0.5 A + d; at ratio 1 the loss is -sum_t A_t / 3 and d loss / d logp_t = -A_t / 3
    (0.0, -(0.999998 - 0.499999 - 0.35) / 3, [[-0.749999 / 3, 0.000001 / 3], [0.599999 / 3]]),
    # clip 0.3: A's second term -0.5 -> -0.3
    (0.3, -(0.999998 - 0.499999 - 0.15) / 3, [[-0.749999 / 3, -0.199999 / 3], [0.599999 / 3]]),
])
def test_the_reference_objective_has_the_distillation_term(clip, loss, grad):
    """Failing first (before the term existed: Seq took no teacher log-probs): coef 0.5,
    weight_reward 0.5, GRPO, token-mean, numbers worked out by hand."""
    o = ref.Options(kl="off", distill_coef=0.5, distill_clip=clip, weight_reward=0.5)
    got = ref.objective(hand_batch(), o)
    assert got.loss == pytest.approx(loss, abs=1e-6)
    for g, want in zip(got.d_logp, grad, strict=True):
        np.testing.assert_allclose(g, want, atol=1e-6)
    assert ref.distill_kl(hand_batch()) == pytest.approx(0.7 / 3)  # old - teacher: -0.5, 1, 0.2


def test_the_algo_terms_are_the_hand_numbers():
    d = algo.token_terms(np.array([-0.5, -3.0, -1.0]), np.array([-1.0, -2.0, -5.0]),
                         (1, 1, 0), 0.5, 0.3)
    np.testing.assert_allclose(d, [0.25, -0.3, 0.0], atol=1e-7)
    np.testing.assert_allclose(algo.combined(2.0, d, 3, 0.5), [1.25, 0.7, 1.0], atol=1e-7)
    np.testing.assert_allclose(algo.combined(2.0, None, 2, 0.0), [0.0, 0.0])
    k = algo.reverse_kl([np.array([-0.5, -3.0])], [np.array([-1.0, -2.0])], [None])
    assert algo.kl_metrics(k)["distill/kl"] == pytest.approx(0.25)


# --- the trainer's path against the reference ----------------------------------------------

P, G, MAX_NEW = 2, 3, 8
ROWS = [  # (advantage, ratio level, loss, turns, off-policy, weight_reward, clip, kl)
    ("grpo", "token", "ppo", 1, False, 0.5, 0.0, "off"),
    ("rloo", "token", "cispo", 2, True, 0.0, 0.3, "loss"),
    ("gae", "token", "ppo", 2, True, 1.0, 0.0, "reward"),
    ("grpo", "sequence", "ppo", 1, True, 1.0, 0.5, "loss"),
    ("reinforce", "token", "ppo", 2, False, 0.3, 0.0, "off"),
]


def random_batch(row: tuple, seed: int) -> list[ref.Seq]:
    adv, _, _, turns, off, *_ = row
    rng = np.random.default_rng(seed)
    seqs = []
    for i in range(P * G):
        mask = np.ones(int(rng.integers(1, 7)))
        if turns == 2 and i % 2 == 0:
            mask = np.concatenate([mask, np.zeros(int(rng.integers(1, 4))),
                                   np.ones(int(rng.integers(1, 5)))])
        n, fb = len(mask), mask == 0
        old = f32(np.where(fb, 0.0, rng.normal(-1.5, 0.5, n)))
        logp = f32(np.where(fb, rng.normal(-2, 1, n), old + (rng.normal(0, 0.2, n) if off
                                                             else 0.0)))
        seqs.append(ref.Seq(group=i // G, score=float(f32(rng.uniform())), old=old, logp=logp,
                            ref=f32(old + rng.normal(0, 0.3, n)), mask=mask,
                            entropy=f32(rng.uniform(0.5, 3.0, n)),
                            old_values=f32(rng.uniform(0, 1, n)), values=np.zeros(n),
                            teacher=f32(np.where(fb, rng.normal(-2, 1, n),
                                                 old + rng.normal(0, 0.8, n)))))
        seqs[-1].values = f32(seqs[-1].old_values + rng.normal(0, 0.3, n))
    return seqs


def f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(np.float64)


def row_config(row: tuple):
    adv, level, loss, turns, off, weight, clip, kl = row
    return check(load(None, [
        f"rl.advantage={adv}", f"rl.scale={'batch' if adv == 'reinforce' else 'group'}",
        f"rl.ratio_level={level}", f"rl.loss={loss}", f"generation.max_turns={turns}",
        f"rl.num_iterations={2 if off else 1}", f"rl.kl_penalty={0 if kl == 'off' else 0.1}",
        f"rl.kl_in_reward={str(kl == 'reward').lower()}", "rl.drop_zero_std=false",
        f"generation.num_samples_per_prompt={G}", f"training.batch_size={P}",
        f"generation.max_new_tokens={MAX_NEW}", "distill.kind=teacher", "distill.teacher=x",
        "distill.coef=0.7", f"distill.clip={clip}", f"distill.weight_reward={weight}"]))


def rollout_of(s: ref.Seq, i: int) -> Rollout:
    return Rollout(Task(f"t{s.group}", "p"), tuple(range(3, 5 + i % 3)),
                   tuple(range(20, 20 + len(s.mask))), tuple(s.old.tolist()), "x", "stop", 1.0,
                   tuple(int(m) for m in s.mask) if (s.mask == 0).any() else None)


@pytest.mark.parametrize("seed, row", list(enumerate(ROWS)), ids=[r[0] + r[1] for r in ROWS])
def test_the_trainer_adds_the_term_as_the_reference_does(seed, row):
    import mlx.core as mx

    from mlx_rlaif.algo.objective import objective

    cfg = row_config(row)
    d = cfg.distill
    seqs = random_batch(row, seed)
    o = ref.Options(advantage=row[0], ratio_level=row[1], loss=row[2], kl=row[7],
                    kl_penalty=0.1, max_new_tokens=MAX_NEW, batch_sequences=P * G,
                    distill_coef=d.coef, distill_clip=d.clip, weight_reward=d.weight_reward)
    want = ref.objective(seqs, o)
    rollouts = [rollout_of(s, i) for i, s in enumerate(seqs)]
    by_id = {id(r): s for r, s in zip(rollouts, seqs, strict=True)}
    ops = SimpleNamespace(reference=lambda p, rs, c: [by_id[id(r)].ref for r in rs],
                          values=lambda p, rs, c, mean: [by_id[id(r)].old_values for r in rs])
    run = SimpleNamespace(cfg=cfg, ops=ops, policy=None, world=SimpleNamespace(reduce=None),
                          state=SimpleNamespace(reinforce_baseline=0.0))
    terms = Terms([algo.token_terms(s.teacher, s.old, r.mask, d.coef, d.clip)
                   for s, r in zip(seqs, rollouts, strict=True)], {})
    penalty = cfg.rl.kl_penalty
    targets = (critic_targets(run, rollouts, [s.score for s in seqs], penalty, terms)
               if row[0] == "gae" else
               group_targets(run, rollouts, [s.score for s in seqs], penalty, None, terms))
    assert targets.keep == list(range(len(seqs)))
    w = aggregation_weights([r.trained_tokens for r in rollouts], loss_aggregation(cfg.rl),
                            MAX_NEW, batch_sequences(cfg))
    mb = build(rollouts, targets.adv, w, targets.ref,
               fields={**(targets.critic or {}), "logp": [s.logp for s in seqs],
                       "values": [s.values for s in seqs]})
    lp, v = mx.array(mb.pop("logp")), mx.array(mb.pop("values"))
    arrays = {k: mx.array(x) for k, x in mb.items()}

    def loss(lp):
        return objective(lp, mx.zeros_like(lp), arrays, cfg.rl, penalty,
                         values=v if row[0] == "gae" else None)

    (total, _), grad = mx.value_and_grad(loss)(lp)
    assert total.item() == pytest.approx(want.loss, rel=1e-4, abs=1e-6)
    grad = np.array(grad)
    for i, (r, e) in enumerate(zip(rollouts, want.d_logp, strict=True)):
        start = len(r.prompt_tokens) - 1
        np.testing.assert_allclose(grad[i, start: start + len(r.tokens)], e, rtol=1e-4,
                                   atol=1e-6)


def test_a_completion_without_a_term_keeps_its_group_rule():
    """Self-distillation: a completion without context has no term, so a zero-variance group's
    completions without one stay out of the loss; one with a term is trained on."""
    cfg = check(load(None, ["distill.kind=self", "generation.num_samples_per_prompt=2",
                            "training.batch_size=1"]))
    rollouts = [Rollout(Task("t", "p"), (1, 2), (3, 4), (-1.0, -1.0), "x", "stop", 1.0)
                for _ in range(2)]
    run = SimpleNamespace(cfg=cfg, ops=None, policy=None, world=SimpleNamespace(reduce=None),
                          state=SimpleNamespace(reinforce_baseline=0.0))
    terms = Terms([None, np.array([0.2, -0.1], np.float32)], {})
    t = group_targets(run, rollouts, [0.0, 0.0], 0.0, None, terms)
    assert t.keep == [1]
    np.testing.assert_allclose(t.adv[0], [0.2, -0.1])


# --- self-distillation's context ------------------------------------------------------------


def exec_reward(passed: list[bool], value: float) -> Reward:
    return Reward(value, details={"tests": [{"passed": p, "reason": None if p else "wrong",
                                             "got": "0"} for p in passed]})


def test_the_context_holds_the_trusted_report_a_critique_and_a_passing_sibling():
    task = Task("t", "Write f.", entry_point="f",
                tests=({"args": [1], "expected": 2}, {"args": [2], "expected": 4}))
    failed = Reward(0.5, details={"exec": exec_reward([True, False], 0.5).details,
                                  "teacher": {"rationale": "off by one"}})
    ok = exec_reward([True, True], 1.0)
    rollouts = [Rollout(task, (1,), (2,), (-1.0,), text, "stop", 1.0)
                for text in ("print('ALL TESTS PASSED')", "def f(x): return 2 * x")]
    texts = contexts(rollouts, [failed, ok], [task, task], ["t", "t"],
                     ("feedback", "critique", "sibling"), 600)
    assert "f(2) should return 4, got 0" in texts[0] and "off by one" in texts[0]
    assert "def f(x): return 2 * x" in texts[0]
    assert "ALL TESTS PASSED" not in texts[0]  # the student's own output never goes in
    assert texts[1] == ""  # passed, and its only sibling did not
    assert context(task, ok, "def f(x): ...", True, True, 600).count("A correct solution") == 1
    assert contexts(rollouts, [failed, ok], [task, task], ["t", "t"], ("critique",), 600)[0] \
        .startswith("A reviewer's critique")


# --- config -----------------------------------------------------------------------------------


@pytest.mark.parametrize("sets, keys", [
    (("distill.kind=teacher",), ("distill.kind", "distill.teacher")),
    (("distill.kind=self", "model.backend=torch"), ("distill.kind", "model.backend")),
    (("distill.kind=self", "reward.type=syntax"), ("distill.kind", "reward.type")),
])
def test_a_refusal_is_one_line_naming_both_options(sets, keys):
    with pytest.raises(ConfigError) as e:
        check(load(None, list(sets)))
    assert all(k in str(e.value) for k in keys) and "\n" not in str(e.value)


# --- runs ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A student (micro shape), a teacher with the same tokenizer (other random weights) and a
    model whose tokenizer was trained on other text."""
    root = tmp_path_factory.mktemp("distill")
    other = make_model_dir(root / "other", "micro", seed=2, dtype=TEST_DTYPE)
    make_tokenizer(other, 512, ["print(1)\n", "while True: pass\n"])
    return {"student": make_model_dir(root / "student", "micro", seed=3, dtype=TEST_DTYPE),
            "teacher": make_model_dir(root / "teacher", "micro", seed=11, dtype=TEST_DTYPE),
            "other": other}


def test_a_teacher_with_another_tokenizer_is_refused_at_load_in_one_line(models):
    from mlx_lm import load as mlx_load

    from mlx_rlaif.backends.mlx.teacher import load_teacher

    _, student_tok = mlx_load(str(models["student"]))
    with pytest.raises(UsageError) as e:
        load_teacher(str(models["other"]), student_tok, str(models["student"]))
    text = str(e.value)
    assert "\n" not in text and str(models["other"]) in text and "tokenizer" in text
    assert str(models["student"]) in text  # both tokenizers named
    assert load_teacher(str(models["teacher"]), student_tok, str(models["student"])).split


def edited(models: dict[str, Path], tmp_path: Path, name: str, edit) -> Path:
    """A copy of the test teacher with `edit(dir)` applied to its files."""
    import shutil

    d = tmp_path / name
    shutil.copytree(models["teacher"], d)
    edit(d)
    return d


def rewrite(d: Path, file: str, change) -> None:
    data = json.loads((d / file).read_text()) if (d / file).exists() else {}
    change(data)
    (d / file).write_text(json.dumps(data))


def add_known_word(d: Path) -> None:
    """As red-team teacher t7: an added, non-special token whose text is a word the vocabulary
    already has (same get_vocab(), other encodings), a word no probe string holds."""
    from mlx_rlaif.backends.mlx.teacher import PROBES

    tok = json.loads((d / "tokenizer.json").read_text())
    word, i = next((w, i) for w, i in sorted(tok["model"]["vocab"].items(), key=lambda x: -x[1])
                   if w.isalpha() and w.isascii() and len(w) > 2
                   and not any(w in p for p in PROBES))
    tok["added_tokens"].append({"id": i, "content": word, "single_word": False,
                                "lstrip": False, "rstrip": False, "normalized": True,
                                "special": False})
    (d / "tokenizer.json").write_text(json.dumps(tok))


@pytest.mark.parametrize("name, edit", [
    ("added", add_known_word),  # red-team t7
    ("eos_set", lambda d: rewrite(d, "config.json",  # red-team t3b: [2, 0]
                                  lambda c: c.update(eos_token_id=[c["eos_token_id"], 0]))),
    ("gen_eos", lambda d: rewrite(d, "generation_config.json",  # red-team t3c
                                  lambda c: c.update(eos_token_id=1))),
])
def test_a_teacher_with_other_added_tokens_or_eos_ids_is_refused_at_load(models, tmp_path,
                                                                         name, edit):
    """Failing first (B6: the check compared get_vocab(), the probes and one eos_token_id, and
    these three teachers trained): refused in one line naming both tokenizers."""
    from mlx_lm import load as mlx_load

    from mlx_rlaif.backends.mlx.teacher import load_teacher

    _, student_tok = mlx_load(str(models["student"]))
    teacher = edited(models, tmp_path, name, edit)
    with pytest.raises(UsageError, match="does not encode text") as e:
        load_teacher(str(teacher), student_tok, str(models["student"]))
    text = str(e.value)
    assert "\n" not in text and str(teacher) in text and str(models["student"]) in text


def truncate(d: Path) -> None:
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-64])


@pytest.mark.parametrize("name, edit, said", [
    ("layers", lambda d: rewrite(d, "config.json",  # red-team c2: grew to ~23 GB, then killed
                                 lambda c: c.update(num_hidden_layers=10**9)),
     "num_hidden_layers 1000000000"),
    ("vocab", lambda d: rewrite(d, "config.json", lambda c: c.update(vocab_size=10**12)),
     "vocab_size"),
    ("hidden", lambda d: rewrite(d, "config.json", lambda c: c.update(hidden_size=63)),
     "hidden_size 63"),
    ("truncated", truncate, "does not lie inside the file"),
])
def test_a_teacher_whose_config_disagrees_with_its_weights_is_refused_before_loading(
        models, tmp_path, monkeypatch, name, edit, said):
    """Failing first (B7: mlx-lm built the model from config.json first): refused in one line
    from config.json and the safetensors headers, the weights never loaded."""
    from mlx_lm import load as mlx_load

    from mlx_rlaif.backends.mlx import teacher as tm

    _, student_tok = mlx_load(str(models["student"]))
    bad = edited(models, tmp_path, name, edit)

    def no_load(*a, **k):
        raise AssertionError("the teacher's weights were loaded")

    monkeypatch.setattr(tm, "load_model", no_load)
    with pytest.raises(UsageError, match=said) as e:
        tm.load_teacher(str(bad), student_tok, str(models["student"]))
    assert "\n" not in str(e.value) and str(bad) in str(e.value)


def test_a_teacher_over_the_memory_budget_stops_before_loading(models, monkeypatch):
    """Failing first (B7: the plan counted the teacher only once loaded): distill.load_teacher
    plans the teacher's weights from its safetensors headers against the budget less the
    student's weights and stops in one line naming the teacher and the fix."""
    from mlx_lm import load as mlx_load

    from mlx_rlaif.backends.mlx import teacher as tm
    from mlx_rlaif.backends.mlx.weight_files import preflight
    from mlx_rlaif.train.distill import load_teacher

    model, student_tok = mlx_load(str(models["student"]))
    monkeypatch.setattr(tm, "load_model", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("the teacher's weights were loaded")))
    cfg = load(None, [f"model.path={models['student']}", "distill.kind=teacher",
                      f"distill.teacher={models['teacher']}", "training.max_memory_gb=0.0001",
                      *RUN])
    with pytest.raises(UsageError, match="training.max_memory_gb") as e:
        load_teacher(cfg, SimpleNamespace(model=model, tokenizer=student_tok))
    assert "\n" not in str(e.value) and str(models["teacher"]) in str(e.value)
    room = 8 * 2**30 - tm.weight_bytes(model)
    assert preflight("t", "teacher", models["teacher"], room) == tm.weight_bytes(
        mlx_load(str(models["teacher"]))[0])  # the headers' bytes are the loaded bytes


RUN = ("data.train_file=suite:synthetic-train", "data.languages=[python]",
       "data.difficulties=[easy]", "reward.type=exec", "generation.max_new_tokens=12")


@pytest.mark.parametrize("kind", ["teacher", "self"])
def test_two_steps_write_distill_kl_to_batches_jsonl(models, tmp_path, kind):
    """`mlx-rlaif train` as a user runs it, 2 steps of each kind: distill/kl (and for self the
    share of completions with context) in every line of batches.jsonl; the teacher's weights
    in the memory plan's startup line."""
    extra = [f"distill.kind={kind}", *RUN]
    if kind == "teacher":
        extra += [f"distill.teacher={models['teacher']}", "distill.weight_reward=0"]
    else:
        extra += ["distill.self_adapters=reference", "distill.clip=2"]
    out = tmp_path / "run"
    cmd = command(models["student"], Path("unused"), out, 2, *extra)
    cmd[cmd.index("--train-file") + 1] = "suite:synthetic-train"
    proc = run_cli(cmd, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [json.loads(x) for x in (out / "batches.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    for m in lines:
        assert np.isfinite(m["distill/kl"]) and m["distill/kl_p90"] >= m["distill/kl"] - 1e-6
        assert m["distill/seconds"] > 0
        assert ("distill/frac_context" in m) == (kind == "self")
    if kind == "self":  # the random student passes nothing: every completion has feedback
        assert all(m["distill/frac_context"] == 1.0 for m in lines)
    else:
        assert "+ teacher 0.00 GB" in proc.stdout + proc.stderr  # the memory plan counts it


# --- memory ------------------------------------------------------------------------------------


def test_the_memory_plan_counts_the_teachers_weights_and_forward():
    from mlx_rlaif.backends.mlx import memory
    from mlx_rlaif.backends.mlx.memory import GiB, Shape, Work

    mb = 2**20
    s = Shape(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16,
              vocab=4096, weight_bytes=mb, act_bytes=4, lora_params=1000)
    t = Shape(layers=6, hidden=512, intermediate=1376, heads=8, kv_heads=2, head_dim=64,
              vocab=4096, weight_bytes=40 * mb, act_bytes=4, lora_params=0)
    w = Work(prompts=2, group=4, prompt_len=20, new_tokens=100, train_rows=8)
    alone, taught = memory.plan(s, w, 8 * GiB), memory.plan(s, w, 8 * GiB, teacher=t)
    assert (alone.teacher, alone.teacher_pass) == (0, 0)
    assert taught.teacher == 40 * mb
    chunked = Work(**{**w.__dict__, "chunk_mb": memory.logits_chunk_mb(8 * GiB)})
    assert taught.teacher_pass == memory.reference_bytes(t, chunked, taught.micro_batch) > 0
    assert taught.peak >= alone.peak + 40 * mb
    assert taught.peak == memory.peak_bytes(s, chunked, taught.decode_width, taught.micro_batch,
                                            taught.checkpoint, t)
    with pytest.raises(ConfigError, match="distill.teacher_quantize"):  # weights over budget
        memory.plan(s, w, 30 * mb, teacher=t)


def test_doctor_shows_the_teachers_weights_and_forward(models, monkeypatch):
    from mlx_rlaif.commands import doctor

    said: dict[str, str] = {}
    monkeypatch.setattr(doctor, "say", lambda k, v: said.setdefault(k, v))
    cfg = load(None, [f"model.path={models['student']}", "distill.kind=teacher",
                      f"distill.teacher={models['teacher']}", *RUN])
    assert doctor.memory_report(cfg)
    assert "+ teacher" in said["memory"] and "teacher weights" in said["memory"]
    assert "teacher forward" in said["memory"]
    cfg = load(None, [f"model.path={models['student']}", "distill.kind=teacher",
                      f"distill.teacher={models['other']}", *RUN])
    said.clear()
    assert not doctor.memory_report(cfg)
    assert "does not encode text to the student's" in said["memory"]


def test_the_dashboard_and_the_plain_line_show_the_distillation_metrics():
    from mlx_rlaif.metrics.dashboard import distill_text, plain_line

    m = {"distill/kl": 0.4123, "distill/kl_p90": 1.234, "distill/seconds": 0.81,
         "distill/frac_context": 0.75, "reward/mean": 0.5}
    assert distill_text(m) == "kl 0.4123 (p90 1.23)  context 75%  0.81 s"
    assert "context" not in distill_text({k: v for k, v in m.items() if "context" not in k})
    assert "distill kl 0.4123" in plain_line(3, 10, m)
