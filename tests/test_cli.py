"""The command line refuses bad input with one clear line and exit status 2, before loading any model."""
import time

import pytest

from specdec_core import SamplingParams, InputError
from specdec_core.cli import main


@pytest.mark.parametrize("argv,words", [
    (["--prompt", "hi", "--k", "-1"], "k (draft length) must be an integer in [0, 64]"),
    (["--prompt", "hi", "--max-new-tokens", "0"], "max new tokens must be an integer in [1, "),
    (["--prompt", "hi", "--temperature", "1e-40"], "temperature must be 0 (greedy) or at least 0.01"),
    (["--prompt", "hi", "--top-p", "0"], "top-p must be in (0, 1]"),
    (["--prompt", "   "], "the prompt is empty"),
    (["--prompt", "abc\udcff"], "the prompt is not valid UTF-8"),
    (["--prompt-file", "specdec_core"], "is a directory, not a text file"),
    (["--prompt-file", "no/such/file.txt"], "does not exist"),
])
def test_bad_input_is_one_line_before_any_load(argv, words, capsys):
    t = time.perf_counter()
    assert main(["generate", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and words in err and "\n" not in err
    assert time.perf_counter() - t < 5     # no model was loaded (that takes ~15 s)


def test_a_prompt_file_that_is_not_utf8(tmp_path, capsys):
    f = tmp_path / "p.txt"
    f.write_bytes(b"caf\xe9")
    assert main(["generate", "--prompt-file", str(f)]) == 2
    assert "is not UTF-8 text (byte 3)" in capsys.readouterr().err


def test_tiny_temperatures_are_refused_not_nan():
    with pytest.raises(InputError, match="at least 0.01"):
        SamplingParams(temperature=1e-40)
    assert SamplingParams(temperature=0.01).temperature == 0.01


def test_a_missing_draft_config_is_named(tmp_path):
    """The shipped draft's weights without its config: one clear line naming the missing file and how to make
    it (the CLI prints DrafterUnavailable as `error: ...`, status 2), before the target's weights are touched."""
    from specdec_core.cli import USER_ERRORS
    from specdec_core.drafters.distilled import load_draft
    (tmp_path / "draft.safetensors").write_bytes(b"")
    from specdec_core.drafters import DrafterUnavailable
    with pytest.raises(DrafterUnavailable, match=r"no trained draft config at draft.config.json: run "
                                                 r"`python -m specdec_core train draft`") as e:
        load_draft(None, folder=tmp_path)
    assert isinstance(e.value, USER_ERRORS) and "\n" not in str(e.value)
