"""The warm start (docs/sft-then-rl.md): `mlx-rlaif sft`, then `mlx-rlaif train` from its
adapters, with the KL reference `rl.reference: initial` (the frozen adapters the run started
from). Covered: the initial reference equals the policy at the start (KL 0) and stays fixed
while the policy moves; advancing it is a no-op; its refusals; a resume keeps it (the saved
copy, whatever lora.init_adapter says then); SFT data from task records' reference solutions;
the shipped two-command pipeline end to end (subprocesses). Not covered: whether the pipeline
learns more than SFT alone (tools/learning.py's `sft+rl` arm measures that)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from adapters import write_adapters
from mlx.utils import tree_unflatten
from recording_hub import RecordingHub

from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.artifacts.lora import adapter_weights
from mlx_rlaif.backends.mlx.loss import token_logprobs
from mlx_rlaif.backends.mlx.policy import adapters_loaded, load_policy
from mlx_rlaif.backends.mlx.update import advance_reference
from mlx_rlaif.config import check, load
from mlx_rlaif.errors import ConfigError
from mlx_rlaif.train import train
from mlx_rlaif.train.sft import load_config as load_sft
from mlx_rlaif.train.sft import read_examples

ROOT = Path(__file__).resolve().parents[1]
TOKENS = mx.array([[3, 17, 99, 5, 42, 7, 11]])


@pytest.fixture
def init(micro_model, tmp_path) -> Path:
    return write_adapters(micro_model, tmp_path / "init", seed=1)


def _cfg(model: Path, tasks: Path, out: Path, *extra: str):
    return load(None, [
        f"model.path={model}", f"data.train_file={tasks}", f"training.output_dir={out}",
        "reward.type=syntax", "generation.max_new_tokens=10",
        "generation.num_samples_per_prompt=2", "training.batch_size=3",
        "rl.drop_zero_std=false", "rl.entropy_coef=0.05",  # every step moves the weights
        "training.learning_rate=0.01", "rl.kl_penalty=0.5", "logging.tensorboard=false",
        "training.save_every_batches=1", "training.save_total_limit=0", *extra])


def _arrays(path: Path) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in mx.load(str(path)).items()}


def test_the_initial_reference_is_the_start_and_stays_there(micro_model, prompts_file, init,
                                                            tmp_path):
    """KL 0 at the first step (the reference is the policy the run starts from; against the
    base the same start has a KL), above 0 once the policy moved; every checkpoint's reference
    is the initial adapters, bit for bit, while the trained ones moved."""
    steps = {}
    for ref in ("initial", "base"):
        hub = RecordingHub()
        train(_cfg(micro_model, prompts_file, tmp_path / ref, "training.max_steps=3",
                         f"rl.reference={ref}", f"lora.init_adapter={init}"), hub=hub)
        steps[ref] = [m for _, m in hub.steps]
    first = steps["initial"][0]["kl/mean"]
    assert abs(first) < 1e-6, first
    assert steps["base"][0]["kl/mean"] > 1e-4  # the initial adapters are not the base
    assert steps["initial"][-1]["kl/mean"] > 1e-5
    start = _arrays(checkpoint.resolve(init) / checkpoint.ADAPTERS)
    ckpts = checkpoint.list_checkpoints(tmp_path / "initial")
    assert len(ckpts) == 3
    for ckpt in ckpts:
        ref = _arrays(ckpt / checkpoint.REFERENCE)
        assert set(ref) == set(start) and all(np.array_equal(ref[k], start[k]) for k in ref)
    trained = _arrays(ckpts[-1] / checkpoint.ADAPTERS)
    assert any(np.abs(trained[k] - start[k]).max() > 1e-5 for k in start)
    assert not (checkpoint.latest_checkpoint(tmp_path / "base") / checkpoint.REFERENCE).exists()


def test_advancing_the_initial_reference_changes_nothing(micro_model, init):
    """The reference's log-probs are the initial model's, before and after the policy moves
    and the reference is advanced (with periodic settings that would copy at this step)."""
    policy = load_policy(str(micro_model), adapter=init, moving_reference=True)
    start = np.array(token_logprobs(policy.model, TOKENS)[0])
    moved = {k: v + 0.1 for k, v in adapter_weights(policy.model).items()}
    policy.model.update(tree_unflatten(list(moved.items())))
    cfg = load(None, ["rl.reference=initial", f"lora.init_adapter={init}",
                      "rl.ref_update_every=1"])
    advance_reference(policy, cfg, step=1)
    with adapters_loaded(policy.model, policy.reference):
        as_reference = np.array(token_logprobs(policy.model, TOKENS)[0])
    np.testing.assert_array_equal(as_reference, start)
    assert not np.allclose(np.array(token_logprobs(policy.model, TOKENS)[0]), start, atol=1e-4)


def test_a_resume_keeps_the_initial_reference(micro_model, prompts_file, init, tmp_path):
    """Resumed from step 2 with lora.init_adapter pointing at other adapters of the same shape,
    the reference is still the run's initial adapters (restored from the checkpoint), and the
    resumed step 3 equals the straight run's."""
    straight = train(_cfg(micro_model, prompts_file, tmp_path / "a", "training.max_steps=3",
                          "rl.reference=initial", f"lora.init_adapter={init}"),
                     hub=RecordingHub())
    ckpts = {p.name[-3:]: p for p in checkpoint.list_checkpoints(straight)}
    other = write_adapters(micro_model, tmp_path / "other", seed=2)
    resumed = train(_cfg(micro_model, prompts_file, tmp_path / "a", "training.max_steps=3",
                         "rl.reference=initial", f"lora.init_adapter={other}"),
                    resume_from=ckpts["gs2"], hub=RecordingHub())
    again = checkpoint.latest_checkpoint(resumed)
    start = _arrays(checkpoint.resolve(init) / checkpoint.ADAPTERS)
    ref = _arrays(again / checkpoint.REFERENCE)
    assert all(np.array_equal(ref[k], start[k]) for k in start)
    a, b = _arrays(ckpts["gs3"] / checkpoint.ADAPTERS), _arrays(again / checkpoint.ADAPTERS)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("sets, keys", [
    (("rl.reference=initial",), ("rl.reference", "lora.init_adapter")),
    (("rl.reference=initial", "lora.init_adapter=runs/sft", "model.backend=torch"),
     ("rl.reference", "model.backend")),
    (("rl.reference=initial", "lora.init_adapter=runs/sft", "rl.kl_penalty=0"),
     ("rl.reference", "rl.kl_penalty")),
])
def test_refusals_are_one_line_naming_the_options(sets, keys):
    with pytest.raises(ConfigError) as e:
        check(load(None, list(sets)))
    assert all(k in str(e.value) for k in keys) and "\n" not in str(e.value), str(e.value)


def test_sft_reads_task_records_reference_answers(tmp_path):
    """completion_key solution: the body under a Python stub, an instruction's program fenced;
    a record without a solution is skipped; a shipped suite is a source."""
    tasks = tmp_path / "tasks.jsonl"
    rows = [{"prompt": 'def f(x):\n    """Add one."""\n', "solution": "def f(x):\n    return x + 1\n"},
            {"prompt": "Write a C++ program that prints 1.", "language": "cpp",
             "solution": "int main() { return 0; }\n"},
            {"prompt": "def g():\n", "language": "python"}]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_sft(None, [f"sft.train_file={tasks}", "sft.completion_key=solution"])
    examples, skipped = read_examples(cfg.sft.train_file, cfg.sft)
    assert [e.completion for e in examples] == ["    return x + 1",
                                                "```cpp\nint main() { return 0; }\n```"]
    assert skipped == 1
    suite = load_sft(None, ["sft.train_file=suite:synthetic-eval", "sft.completion_key=solution"])
    examples, skipped = read_examples(suite.sft.train_file, suite.sft)
    assert len(examples) > 100 and skipped == 0


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_shipped_pipeline_runs_sft_then_rl_from_its_adapters(tmp_path):
    """The two commands of configs/sft-then-rl*.yaml, as shipped (their default paths, run in a
    scratch directory), a few steps each: the RL run loads the SFT adapters (its reference is
    them, bit for bit, and its first step's KL is 0) and trains (its adapters move)."""
    sft = _cli("sft", "--config", str(ROOT / "configs" / "sft-then-rl-sft.yaml"),
               "--set", "training.max_minutes=0", "--set", "training.max_steps=4",
               "--set", "training.batch_size=8", cwd=tmp_path)
    assert sft.returncode == 0, sft.stderr[-2000:]
    rl = _cli("train", "--config", str(ROOT / "configs" / "sft-then-rl.yaml"), "--no-dashboard",
              "--set", "training.max_minutes=0", "--set", "training.max_steps=2",
              "--set", "data.eval_file=", "--set", "generation.max_new_tokens=24",
              "--set", "generation.num_samples_per_prompt=4", "--set", "training.batch_size=2",
              "--set", "logging.tensorboard=false", "--set", "logging.baseline_eval_batches=0",
              "--set", "training.save_every_batches=1", cwd=tmp_path)
    assert rl.returncode == 0, rl.stderr[-2000:]
    start = _arrays(checkpoint.latest_checkpoint(tmp_path / "runs" / "sft-then-rl-sft")
                    / checkpoint.ADAPTERS)
    assert any(np.abs(v).max() > 0 for k, v in start.items() if k.endswith("lora_b"))
    end = checkpoint.latest_checkpoint(tmp_path / "runs" / "sft-then-rl")
    assert checkpoint.load_state(end).step == 2
    ref, trained = _arrays(end / checkpoint.REFERENCE), _arrays(end / checkpoint.ADAPTERS)
    assert all(np.array_equal(ref[k], start[k]) for k in start)
    assert any(np.abs(trained[k] - start[k]).max() > 0 for k in start)
    rows = [json.loads(x) for x in (tmp_path / "runs" / "sft-then-rl" / "batches.jsonl")
            .read_text().splitlines()]
    kl = [r["kl/mean"] for r in rows if "kl/mean" in r]
    assert kl and abs(kl[0]) < 1e-5, kl


def test_the_learning_report_pairs_the_warm_start_with_the_sft_control(tmp_path, monkeypatch,
                                                                      capsys):
    """tools/learning.py report: rows of one arm at two budgets stay apart, and each sft+rl
    seed is compared with the sft control's run of the same seed and minutes (by hand: pass@1
    16 - 10 = +6, 13 - 12 = +1: mean +3.5; the RL phase's own gains 4 and 2: +3.0)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import learning

    monkeypatch.setattr(learning, "WORK", tmp_path)
    scores = {"pass@1": 0.2, "pass@8": 0.3, "greedy": 0.25, "tasks": 56}
    (tmp_path / "frozen.json").write_text(json.dumps({"before_eval": scores}))

    def row(arm, seed, minutes, p1, **more):
        gains = {"gain/pass@1": p1, "gain/pass@8": p1 / 2, "gain/greedy": p1 * 2}
        return {"arm": arm, "seed": seed, "on": "eval", "minutes": minutes, "max_steps": 0,
                "steps": 5, **gains, **more}

    warm = {"sft_gain/pass@1": 0.0, "rl_gain/pass@8": 0.0, "rl_gain/greedy": 0.0}
    rows = [row("sft", 0, 3, 10.0), row("sft", 1, 3, 12.0), row("sft", 0, 15, 30.0),
            row("sft+rl+share=0.5", 0, 3, 16.0, **warm, **{"rl_gain/pass@1": 4.0}),
            row("sft+rl+share=0.5", 1, 3, 13.0, **warm, **{"rl_gain/pass@1": 2.0})]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    learning.report(type("Args", (), {"on": "eval"})())
    out = capsys.readouterr().out
    assert "| sft | 3 min | 0,1 | 5/5 | +11.0 (+10.0 to +12.0) |" in out
    assert "| sft | 15 min | 0 | 5 | +30.0 |" in out
    assert "| sft+rl+share=0.5 | 3 min | +0.0 (+0.0 to +0.0) | +3.0 (+2.0 to +4.0) |" in out
    assert ("| sft+rl+share=0.5 | 3 min | 0,1 | +3.5 (+1.0 to +6.0) | +1.8 (+0.5 to +3.0) | "
            "+7.0 (+2.0 to +12.0) | 2/2 |") in out
