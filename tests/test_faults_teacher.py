"""Fault injection, teachers: the real anthropic and openai SDK clients against a server on
127.0.0.1 that speaks each API's wire format (tests/fake_api.py) and fails in each way real APIs
fail. Each fault is retried as the SDK documents (connection errors, timeouts, 408/409/429 with
or without `retry-after`, 5xx: `max_retries` more attempts with backoff; a 200 answer is never
retried), then masked as unscorable (None) and counted; 401/403 stop. A 10% random mix over 100
training steps finishes with cost and budget exact. Figures: docs/reliability.md."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from fake_api import Fail, FakeAPI, Say
from fault_api import FAULTS, HUGE, MIX, PRICE, RETRIED, TIMEOUT, FaultMix
from recording_hub import RecordingHub

from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.config import TeacherConfig, load
from mlx_rlaif.errors import TeacherError
from mlx_rlaif.records import Task
from mlx_rlaif.rewards.teacher import TeacherReward
from mlx_rlaif.train import train

KEY = "sk-fault-test-key"
PROVIDERS = ["anthropic", "openai"]
TASK = Task("add1", "Write add1(x) that returns x + 1.")
CODE = "```python\ndef add1(x):\n    return x + 1\n```"


def cfg_for(srv: FakeAPI | None, provider: str, port: int = 0, **kw) -> TeacherConfig:
    host = f"http://127.0.0.1:{srv.port if srv else port}"
    base = {"provider": provider, "model": "judge", "reference": False, "max_retries": 1,
            "timeout_s": TIMEOUT, "base_url": host if provider == "anthropic" else f"{host}/v1",
            **PRICE}
    return TeacherConfig(**{**base, **kw})


@pytest.fixture(autouse=True)
def _keys(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


@pytest.fixture
def server():
    with FakeAPI(api_key=KEY) as s:
        yield s


def score(cfg: TeacherConfig) -> tuple:
    t0 = time.monotonic()
    with TeacherReward(cfg) as t:
        reward = t.score([TASK], [CODE])[0]
        return reward, t.metrics(), time.monotonic() - t0


# --- each fault, every attempt ------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("name", list(FAULTS))
def test_fault_on_every_attempt_is_retried_then_unscorable(server, provider, name):
    make, attempts, words, billed = FAULTS[name]
    server.responder = lambda req: make(server, req)
    reward, m, elapsed = score(cfg_for(server, provider))
    assert reward.value is None and words in reward.reason, reward.reason
    assert all(v is None for v in reward.parts.values())
    assert server.hits() == attempts
    assert m["teacher/unscorable"] == 1.0
    assert m["teacher/calls"] == float(billed)  # an answer that came is paid for, even unusable
    assert m["teacher/cost_usd"] == pytest.approx(0.2 if billed else 0.0)
    if name == "429 retry-after":
        assert elapsed >= 0.2  # the SDK waited as told
    elif name in RETRIED and name != "slow":
        assert elapsed >= 0.5 * 0.75  # its backoff: 0.5 s less up to 25% jitter


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("name", RETRIED)
def test_fault_once_then_the_retry_scores(server, provider, name):
    make = FAULTS[name][0]
    server.push(make(server, None) if name != "slow" else
                Say({"rationale": "late", "scores": server.scores}, delay_s=TIMEOUT + 0.5))
    reward, m, _ = score(cfg_for(server, provider))
    assert reward.value == pytest.approx(0.55)
    assert server.hits() == 2
    assert m["teacher/calls"] == 1.0 and m["teacher/unscorable"] == 0.0
    assert m["teacher/cost_usd"] == pytest.approx(0.2)  # the failed attempt costs nothing


@pytest.mark.parametrize("provider", PROVIDERS)
def test_connection_refused_is_retried_then_unscorable(provider):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with TeacherReward(cfg_for(None, provider, port=port)) as t:
        reward = t.score([TASK], [CODE])[0]
        m = t.metrics()
    assert reward.value is None and "connection failed after 1 retries" in reward.reason
    assert m["teacher/unscorable"] == 1.0 and m["teacher/calls"] == 0.0
    assert time.monotonic() - t0 >= 0.5 * 0.75  # one backoff before the retry


@pytest.mark.parametrize("provider", PROVIDERS)
def test_huge_valid_answer_scores_with_its_rationale_capped(server, provider):
    server.push(Say({"rationale": "y" * HUGE, "scores": server.scores}))
    reward, m, _ = score(cfg_for(server, provider))
    assert reward.value == pytest.approx(0.55)
    assert len(reward.details["rationale"]) <= 4000  # not 8 MB into samples.jsonl


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("status", [401, 403])
def test_401_403_are_not_retried_and_raise(server, provider, status):
    server.responder = lambda req: Fail(status, message=f"key {KEY} refused")
    with TeacherReward(cfg_for(server, provider, max_retries=3)) as t, \
            pytest.raises(TeacherError, match=str(status)) as err:
        t.score([TASK], [CODE])
    assert server.hits() == 1 and KEY not in str(err.value)


# --- training through a 10% mix -------------------------------------------------------------

def _train_cfg(model: Path, tasks: Path, out: Path, srv: FakeAPI, provider: str, *extra: str):
    url = srv.anthropic_url if provider == "anthropic" else srv.openai_url
    return load(None, [
        f"model.path={model}", f"data.train_file={tasks}", f"training.output_dir={out}",
        "reward.type=teacher", f"reward.teacher.provider={provider}", "reward.teacher.model=judge",
        f"reward.teacher.base_url={url}", "reward.teacher.max_retries=1",
        f"reward.teacher.timeout_s={TIMEOUT}", "reward.teacher.price_in_per_mtok=1000",
        "reward.teacher.price_out_per_mtok=5000", "generation.max_new_tokens=8",
        "generation.num_samples_per_prompt=2", "rl.drop_zero_std=false", "rl.entropy_coef=0.05",
        "training.num_epochs=100", "logging.tensorboard=false", *extra])


@pytest.mark.slow
def test_ten_percent_faults_over_100_steps(micro_model, prompts_file, tmp_path):
    with FakeAPI(api_key=KEY) as srv:
        mix = FaultMix(srv, 0.10, seed=20)
        srv.responder = mix
        hub = RecordingHub()
        run_dir = train(_train_cfg(micro_model, prompts_file, tmp_path / "run", srv, "anthropic",
                                   "training.max_steps=100"), hub=hub)
    faults = sum(n for k, n in mix.sent.items() if k != "ok")
    print(f"\nteacher mix over 100 steps: {srv.hits()} requests, {faults} faults {mix.sent}, "
          f"unscorable {hub.steps[-1][1]['teacher/unscorable']:.0f}, "
          f"calls {hub.steps[-1][1]['teacher/calls']:.0f}")
    assert [s for s, _ in hub.steps] == list(range(1, 101))  # the run finished
    assert checkpoint.load_state(checkpoint.latest_checkpoint(run_dir)).step == 100
    last = hub.steps[-1][1]
    assert faults >= 20 and set(mix.sent) == set(MIX) | {"ok"}  # every kind was drawn
    assert last["teacher/unscorable"] > 0  # some failed on both attempts: masked, counted
    masked = sum(1 for s in hub.samples if s["reward"] is None)
    assert masked == last["teacher/unscorable"]  # every None is counted, every count a None
    assert last["teacher/cost_usd"] == pytest.approx(mix.cost(), rel=1e-9, abs=1e-12)


def test_faults_and_budget_end_the_run_with_exact_cost(micro_model, prompts_file, tmp_path):
    with FakeAPI(api_key=KEY) as srv:
        mix = FaultMix(srv, 0.10, seed=7)
        srv.responder = mix
        hub = RecordingHub()
        run_dir = train(_train_cfg(micro_model, prompts_file, tmp_path / "run", srv, "openai",
                                   "reward.teacher.max_cost_usd=3.0"), hub=hub)
    assert any("budget" in m for m in hub.messages), hub.messages
    cost = hub.steps[-1][1]["teacher/cost_usd"]
    assert cost == pytest.approx(mix.cost(), rel=1e-9)  # what the server was paid for
    assert 3.0 <= cost < 3.0 + 4 * 0.2 + 1e-9  # over by at most the calls in flight (4)
    assert checkpoint.latest_checkpoint(run_dir).name.startswith("checkpoint-final")


@pytest.mark.parametrize("status", [401, 403])
def test_401_403_mid_run_stop_with_a_checkpoint(micro_model, prompts_file, tmp_path, status):
    with FakeAPI(api_key=KEY) as srv:
        mix = FaultMix(srv, 0.0, seed=1)
        srv.responder = mix
        hub = RecordingHub()

        class Arm(RecordingHub):
            def log_step(self, step: int, metrics: dict) -> None:
                super().log_step(step, metrics)
                hub.steps.append((step, metrics))
                if step == 2:
                    mix.fatal = status  # from step 3 on the key is refused

        arm = Arm()
        run_dir = train(_train_cfg(micro_model, prompts_file, tmp_path / "run", srv, "openai",
                                   "training.max_steps=10"), hub=arm)
    assert [s for s, _ in hub.steps] == [1, 2]  # step 3 was in progress: the only one lost
    assert any("stopping" in m and str(status) in m for m in arm.messages), arm.messages
    ckpt = checkpoint.latest_checkpoint(run_dir)
    assert ckpt.name == "checkpoint-final-gs2" and checkpoint.load_state(ckpt).step == 2
