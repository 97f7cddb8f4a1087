"""The training-side study's parts (synthetic/facts_study.py) are valid commands with valid configs: a part that
would fail after hours of the parts before it fails here in a second."""

import pytest

from synthetic.facts_study import PARTS


@pytest.mark.parametrize("name", sorted(PARTS))
def test_every_part_parses_into_a_valid_config(name, tmp_path):
    from mechfact.cli import build_parser
    from mechfact.facts import experiments as ex

    a = build_parser().parse_args(["facts", *PARTS[name], "--out", str(tmp_path / name)])
    assert a.facts_cmd in ("capacity", "multihop")
    if a.facts_cmd == "capacity":
        cfg = ex.FactsCapacityConfig(subjects=a.subjects, relations=a.relations, embeddings=a.embeddings,
                                     search=a.search, d=a.d, mlp_width=a.mlp_width, seeds=a.seeds,
                                     attributes=a.attributes, model=ex.ModelSpec(outputs=a.outputs))
        if name.startswith("pool_"):
            assert cfg.attributes and cfg.model.outputs == "attributes" and cfg.seeds >= 2
