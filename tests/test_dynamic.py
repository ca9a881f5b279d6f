"""Dynamic sampling (groups with signal, leftovers carried with their policy version) and the
curriculum (buckets drawn by recent pass rate): by hand, and end to end with an exact resume."""

from __future__ import annotations

import time
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from recording_hub import RecordingHub
from resume_check import assert_resumed_equals_straight

from mlx_rlaif.artifacts import checkpoint
from mlx_rlaif.config import load
from mlx_rlaif.data.curriculum import Curriculum, Stream, bucket_of, bucket_weights
from mlx_rlaif.data.tasks import TaskOrder
from mlx_rlaif.records import Reward, Rollout, Task
from mlx_rlaif.train import step, train
from mlx_rlaif.train.carry import Group, carry_state, restore_carry
from mlx_rlaif.train.distributed import World
from mlx_rlaif.train.dynamic import collect
from mlx_rlaif.train.run import Run


def _task(i: int, difficulty: str = "easy", family: str = "f") -> Task:
    return Task(f"t{i}", f"p{i}", difficulty=difficulty, meta={"family": family})


def test_bucket_weights_by_hand():
    # p(1 - p) + floor: 0.25 + 0.05, 0 + 0.05, 0.09 + 0.05 -> normalized over 0.49
    np.testing.assert_allclose(bucket_weights([0.5, 1.0, 0.1], 0.05),
                               [0.30 / 0.49, 0.05 / 0.49, 0.14 / 0.49])
    assert bucket_of(_task(0, "hard", "sums"), ("difficulty", "family")) == "hard/sums"
    assert bucket_of(Task("x", "p"), ("difficulty", "family")) == "-/-"


def test_curriculum_draws_toward_informative_buckets_and_resumes():
    tasks = [_task(i, d) for i, d in enumerate(["easy"] * 10 + ["medium"] * 10 + ["hard"] * 10)]
    c = Curriculum.of(tasks, ("difficulty",), seed=0, floor=0.05, rate=1.0)
    c.observe([(tasks[0], 1.0), (tasks[10], 0.5), (tasks[20], 0.0)], ("difficulty",))
    assert c.pass_rate == {"easy": 1.0, "medium": 0.5, "hard": 0.0}
    twin = Curriculum.of(tasks, ("difficulty",), seed=0, floor=0.05, rate=1.0)
    twin.restore(c.state())
    drawn = [tasks[i].difficulty for i in c.draw(400)]
    assert drawn.count("medium") > 0.7 * len(drawn)  # 0.30 / 0.40 of the weight
    assert drawn.count("easy") > 0 and drawn.count("hard") > 0  # the floor: never starved
    assert [tasks[i].difficulty for i in twin.draw(400)] == drawn  # the state is all it needs


def test_stream_without_curriculum_follows_the_epochs_order():
    tasks = [_task(i) for i in range(5)]
    order = TaskOrder(5, seed=3)
    s = Stream(tasks, order)
    first, last = s.take(3), s.take(3)
    assert [t.id for t in first + last] == [f"t{i}" for i in order.permutation(0)]
    assert (s.epoch, s.cursor) == (1, 0) and len(last) == 2  # the last batch is shorter
    across = s.take(7, across=True)
    assert len(across) == 7 and (s.epoch, s.cursor) == (2, 2)


def _scored(task: Task, values: list[float]) -> tuple[list[Rollout], list[Reward]]:
    rs = [Rollout(task, (1,), (2,), (0.0,), "x", "stop", 1.0) for _ in values]
    return rs, [Reward(v) for v in values]


def test_collect_keeps_groups_with_signal_and_carries_the_rest():
    """Needs 2 groups; the first round (3 prompts = 1.5 x 2) gives one group with signal; a
    second round gives two more: 2 used, 1 carried, a stale carried group dropped."""
    flat = {"t0": [1.0, 1.0], "t1": [0.0, 1.0], "t2": [0.5, 0.5], "t3": [0.0, 1.0],
            "t4": [1.0, 0.0]}
    pending = [_task(i) for i in range(5)]

    def sample(tasks, first):
        out = [_scored(t, flat[t.id]) for t in tasks]
        seen.extend(r for rs, _ in out for r in rs)
        return ([r for rs, _ in out for r in rs], [w for _, ws in out for w in ws],
                {"gen/tokens": 4.0, "gen/seconds": 1.0, "gen/tokens_per_sec": 4.0,
                 "gen/decode_width": 4.0})

    def draw(n):
        taken, pending[:] = pending[:n], pending[n:]
        return taken

    seen = []  # every sampled completion (the step observes them for the curriculum)
    stale = Group(*_scored(_task(9), [0.0, 1.0]), version=0)
    run = SimpleNamespace(cfg=load(None, ["rl.dynamic_sampling=true"]),
                          state=SimpleNamespace(step=5), carry=[stale], world=World())
    used, gen, m = collect(run, 2, draw, sample)
    assert [g.rollouts[0].task.id for g in used] == ["t1", "t3"]
    assert [g.rollouts[0].task.id for g in run.carry] == ["t4"] and run.carry[0].version == 5
    assert m["sample/rounds"] == 2 and m["sample/carried_dropped"] == 1
    assert m["sample/groups_zero_std"] == 2 and m["sample/generations"] == 10
    assert m["sample/generations_per_kept_group"] == 5 and len(seen) == 10
    assert gen["gen/tokens"] == 8.0
    back = restore_carry(carry_state(run.carry), {"t4": _task(4)})
    assert back[0].rewards[1].value == 0.0 and back[0].version == 5


@pytest.mark.slow
def test_dynamic_sampling_and_curriculum_train_and_resume_exactly(tmp_path):
    """On the shipped tiny model and the synthetic suite (rewards that vary): every step trains
    on groups with signal, leftovers carry, and a resumed run (carried groups and curriculum
    state from the checkpoint) equals the straight one."""
    def cfg(out, steps):
        return load(None, [f"training.output_dir={out}", f"training.max_steps={steps}",
                           "data.languages=[python]", "data.difficulties=[easy]",
                           "rl.dynamic_sampling=true", "data.curriculum=true",
                           "training.batch_size=2", "generation.num_samples_per_prompt=4",
                           "generation.max_new_tokens=32", "logging.tensorboard=false",
                           "training.save_every_batches=1", "training.save_total_limit=0",
                           "data.eval_file="])

    hub = RecordingHub()
    straight = train(cfg(tmp_path / "a", 3), hub=hub)
    for _, m in hub.steps:
        assert m["reward/frac_zero_std"] == 0.0 and m["sample/groups_kept"] <= 2
    two = next(p for p in checkpoint.list_checkpoints(straight) if p.name.endswith("gs2"))
    assert (two / "curriculum.json").is_file()
    resumed = train(cfg(tmp_path / "a", 3), resume_from=two, hub=RecordingHub())
    assert_resumed_equals_straight(straight, resumed, 3)


@pytest.mark.slow
def test_scoring_while_decoding_gives_the_rewards_scoring_after_gives(tmp_path, monkeypatch):
    """Shipped tiny model, exec reward, two chunks of decoding per step: with
    generation.score_while_decoding the first chunk's groups are scored while the second chunk
    decodes, and the samples, rewards and adapters equal those of scoring after."""
    calls: list[tuple[str, float]] = []  # (phase, time): "score" starts, "sampled" ends
    real_score, real_sample = step.score, Run.sample

    def score(run, rollouts):
        calls.append(("score", time.perf_counter()))
        return real_score(run, rollouts)

    def sample(self, *args, **kwargs):
        out = real_sample(self, *args, **kwargs)
        calls.append(("sampled", time.perf_counter()))
        return out

    monkeypatch.setattr(step, "score", score)
    monkeypatch.setattr(Run, "sample", sample)

    def run(out, overlap):
        calls.clear()
        cfg = load(None, [f"training.output_dir={out}", "training.max_steps=2",
                          "data.languages=[python]", "data.difficulties=[easy]",
                          "training.batch_size=2", "generation.num_samples_per_prompt=4",
                          "generation.completion_batch_size=4", "generation.max_new_tokens=48",
                          f"generation.score_while_decoding={str(overlap).lower()}",
                          "logging.tensorboard=false", "data.eval_file="])
        hub = RecordingHub()
        d = train(cfg, hub=hub)
        return d, [(s["completion"], s["reward"]) for s in hub.samples], list(calls)

    a, after, order_a = run(tmp_path / "after", False)
    b, overlapped, order_b = run(tmp_path / "overlap", True)
    assert overlapped == after and len(after) == 16
    assert [p for p, _ in order_a] == ["sampled", "score"] * 2  # one call after each batch
    first_sampled = next(t for p, t in order_b if p == "sampled")
    assert sum(p == "score" for p, _ in order_b) == 4  # one call per group
    assert sum(p == "score" and t < first_sampled for p, t in order_b) >= 1
    wa = mx.load(str(checkpoint.latest_checkpoint(a) / checkpoint.ADAPTERS))
    wb = mx.load(str(checkpoint.latest_checkpoint(b) / checkpoint.ADAPTERS))
    # the same samples and rewards train the same adapters, up to float32 rounding: scoring
    # while decoding decodes with the cores shared (another BLAS thread count and, on the CPU
    # build, the transposed decode layout), so the sampler's recorded log-probs differ in their
    # last bits; through two AdamW steps that moved weights by up to 0.8% of their size (1,361
    # of 2,048 bits apart, by at most 8.7e-08, on a fresh machine). A scoring mix-up (a reward
    # on the wrong completion) moves them by the order of the learning rate (1e-4): 1,000x more
    for k in wa:
        np.testing.assert_allclose(np.array(wb[k]), np.array(wa[k]), rtol=0.05, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("reward", ["teacher", "mix"])
def test_dynamic_sampling_works_with_a_judge(tmp_path, reward):
    """Signal read from a judge's scores (a scripted judge through the real openai SDK on a
    local server, scoring by correctness), alone or mixed with the exec reward; groups scored
    while the rest decode."""
    import scripted_judges as sj
    from fake_api import FakeAPI

    from mlx_rlaif.data import load_tasks

    tasks = load_tasks("suite:synthetic-train", languages=["python"], difficulties=["easy"])
    oracle = sj.Oracle(tasks)
    try:
        with FakeAPI() as srv:
            srv.responder = sj.responder(sj.control(oracle))
            hub = RecordingHub()
            train(load(None, [
                f"training.output_dir={tmp_path / 'run'}", "training.max_steps=2",
                "data.languages=[python]", "data.difficulties=[easy]", "data.eval_file=",
                "rl.dynamic_sampling=true", "training.batch_size=2",
                "generation.num_samples_per_prompt=4", "generation.max_new_tokens=48",
                "logging.tensorboard=false", "logging.collect_dataset=false",
                f"reward.type={reward}", "reward.teacher.provider=openai",
                "reward.teacher.model=judge", f"reward.teacher.base_url={srv.openai_url}",
                "reward.teacher.reference=false", "reward.teacher.concurrency=8"]), hub=hub)
            assert srv.hits() > 0
    finally:
        oracle.close()
    assert len(hub.steps) == 2
    for _, m in hub.steps:
        assert m["reward/frac_zero_std"] == 0.0 and m["sample/groups_kept"] >= 1
        assert m["teacher/calls"] > 0
