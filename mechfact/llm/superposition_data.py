"""What the superposition test on a pretrained language model (:mod:`mechfact.llm.superposition`) runs on: its
configuration (:class:`LlmSuperpositionConfig`), the subjects that every relation shares, the attribute codes of
their objects (unembedding rows or one-hot classes) and the subject states at the subject's last token of a
relation-neutral prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import hooks
from ..config import DictConfig, check_choice, check_float, check_int, check_int_list
from ..probes.queries import ProbeSet, Site, collect
from .models.loading import DTYPES, LanguageModel
from .prompts import build_prompts, object_token_ids
from .relations import Relation, shipped_relations_dir

ATTRIBUTES = ("unembed", "class")
PROMPTS = {"bare": "{}", "words": "Some facts about {}"}  # named prompts: the subject alone, or after words


def countries_dir():
    """The shipped multi-relation dataset: 73 countries under five relations."""
    return shipped_relations_dir().parent / "countries"


@dataclass
class LlmSuperpositionConfig(DictConfig):
    """Options of the superposition test on a pretrained language model (:func:`mechfact.llm_superposition`,
    ``mechfact llm superposition``): the model, the relations sharing subjects, the layers, the prompt, the
    attribute codes, the folds and the nulls.

    Not to be confused with :class:`mechfact.probes.experiments.SuperpositionConfig`, which configures the same
    question on a synthetic fact model (``mechfact probe superposition``: only the held-out share).
    """

    model: str = "default"  # hub name, local HF folder, .gguf, short name (mechfact.llm.models.registry)
    relations: str | None = None  # a folder of relations sharing subjects; None = mechfact/data/countries
    relation_names: list[str] | None = None
    layers: list[int] | None = None  # None = every layer
    prompt: str = "{}"  # relation-neutral prompt with one {} for the subject, or a name in PROMPTS
    attributes: str = "unembed"  # unembed | class
    heldout_fraction: float = 0.2  # sets the folds when folds is None: round(1 / heldout_fraction)
    n_splits: int = 1  # repeats of the k-fold partition (each subject held out once per repeat)
    min_relations: int = 4  # subjects must carry at least this many of the relations (all are used)
    dtype: str = "float32"
    batch_size: int = 16
    cache_states: bool = True
    standardize: bool = False  # z-score every coordinate with the training subjects' mean and std (per fold)
    folds: int | None = None  # k of the k-fold over subjects (None: from heldout_fraction, 5 for 0.2)
    n_null: int = 200  # draws of each null (shuffled, random features, per-relation, decodability)
    nuisance_pcs: int = 3  # principal components of the layer-0 state among the nuisance regressors
    drop_massive: bool = False  # remove coordinates holding > DROP_SHARE of the training subjects' variance

    def __post_init__(self) -> None:
        for name in ("standardize", "drop_massive", "cache_states"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} {getattr(self, name)!r}: must be true or false")
        if isinstance(self.prompt, str) and self.prompt in PROMPTS:
            self.prompt = PROMPTS[self.prompt]
        if not isinstance(self.prompt, str) or self.prompt.count("{}") != 1:
            raise ValueError(f"--prompt {self.prompt!r}: must contain exactly one '{{}}' (the subject), or be one of "
                             f"{', '.join(PROMPTS)}")
        check_choice("attributes", self.attributes, ATTRIBUTES)
        check_float("heldout", self.heldout_fraction, lo=0, hi=1, lo_open=True, hi_open=True)
        check_int("splits", self.n_splits, 1)
        if self.folds is not None:
            check_int("folds", self.folds, 2)
        if isinstance(self.n_null, bool) or not isinstance(self.n_null, int) or self.n_null < 19:
            raise ValueError(f"--n-null {self.n_null}: must be an integer >= 19 (with fewer draws no p-value can be "
                             "below 0.05)")
        check_int("nuisance_pcs", self.nuisance_pcs, 0)
        check_int("min_relations", self.min_relations, 2)
        check_choice("dtype", self.dtype, DTYPES)
        check_int("batch_size", self.batch_size, 1)
        if self.layers is not None:
            check_int_list("layers", self.layers, 0, "give at least one layer, or all")

    @property
    def k_folds(self) -> int:
        return self.folds if self.folds is not None else max(2, int(round(1 / self.heldout_fraction)))


def shared_subjects(rels: list[Relation], min_relations: int) -> tuple[list[str], list[Relation]]:
    """Subjects present in every relation (sorted), and the relations; ValueError when too few."""
    if len(rels) < min_relations:
        raise ValueError(f"--relations: {len(rels)} relations given; the test needs at least {min_relations} "
                         "relations that share subjects")
    common = set(rels[0].subjects)
    for r in rels[1:]:
        common &= set(r.subjects)
    subjects = sorted(common)
    if len(subjects) < 20:
        raise ValueError(f"--relations: only {len(subjects)} subjects are in all of {', '.join(r.name for r in rels)}; "
                         "need at least 20 to fit on some and score the rest")
    return subjects, rels


def _objects(rel: Relation, subjects: list[str]) -> list[str]:
    obj = dict(zip(rel.subjects, rel.objects))
    return [obj[s] for s in subjects]


def shared_first_token(lm: LanguageModel, rels: list[Relation], subjects: list[str]) -> dict[str, list[list[str]]]:
    """Per relation, the groups of its objects that share a first token (their unembedding rows coincide)."""
    out = {}
    for rel in rels:
        groups: dict[int, list[str]] = {}
        for o in dict.fromkeys(_objects(rel, subjects)):
            groups.setdefault(object_token_ids(lm.tokenizer, o)[0], []).append(o)
        out[rel.name] = [sorted(g) for g in groups.values() if len(g) > 1]
    return out


def attribute_table(lm: LanguageModel, rels: list[Relation], subjects: list[str], kind: str
                    ) -> tuple[np.ndarray, np.ndarray, list[list[str]]]:
    """(V (n_codes, k), perms (R, n_subjects) row indices into V, code names per relation).

    ``unembed``: one code per distinct first token of the relation's objects; objects sharing a first token share
    the code (its name joins theirs with " / "). ``class``: one one-hot code per object."""
    rows, perms, names = [], [], []
    W_U = lm.W_U.detach().float().cpu() if kind == "unembed" else None
    for rel in rels:
        objs = _objects(rel, subjects)
        key = {o: (object_token_ids(lm.tokenizer, o)[0] if kind == "unembed" else o) for o in dict.fromkeys(objs)}
        codes = list(dict.fromkeys(key.values()))
        index = {c: len(rows) + i for i, c in enumerate(codes)}
        if kind == "unembed":
            rows += [W_U[:, c].double().numpy() for c in codes]
        else:
            rows += [None] * len(codes)
        perms.append([index[key[o]] for o in objs])
        names.append([" / ".join(sorted(o for o in key if key[o] == c)) for c in codes])
    V = np.eye(len(rows)) if kind == "class" else np.stack(rows)
    return V, np.array(perms), names


KNOWN_SHARE = 0.5  # a subject is "known" when the model recalls MORE than this share of its relations


def subject_recall(lm: LanguageModel, rels: list[Relation], subjects: list[str], k_shot: int = 3,
                   batch_size: int = 16) -> np.ndarray:
    """(n_subjects, R) whether the model recalls each subject's object under each relation: its top next token,
    on a ``k_shot`` in-context prompt of the relation (seed 0), spells the object
    (:func:`mechfact.probes.known.spells_object`: a generic first token such as " the" does not count)."""
    from ..probes.queries import predictions
    from ..probes.known import knows

    index = {s: k for k, s in enumerate(subjects)}
    out = np.zeros((len(subjects), len(rels)), dtype=bool)
    for r, rel in enumerate(rels):
        prompts = [p for p in build_prompts(rel, lm.tokenizer, lm.bos_id, k=k_shot, seed=0) if p.subject in index]
        top = predictions(lm, ProbeSet.from_prompts(prompts, pad_id=lm.pad_id), batch_size=batch_size)
        for p, ok in zip(prompts, knows(lm.tokenizer, top, [p.object for p in prompts], "spells")):
            out[index[p.subject], r] |= ok
    return out


def subject_states(lm: LanguageModel, subjects: list[str], cfg: LlmSuperpositionConfig, layers: list[int],
                   progress: bool = False) -> torch.Tensor:
    """(layers, n_subjects, d_model) states at the subject's last token of the neutral prompt."""
    probe = Relation("subjects", [cfg.prompt], [(s, "-") for s in subjects])
    prompts = build_prompts(probe, lm.tokenizer, lm.bos_id, k=0)
    ps = ProbeSet.from_prompts(prompts, pad_id=lm.pad_id)
    sites = [Site(hooks.resid(layer, "post"), "subject") for layer in layers]
    acts = collect(lm, ps, sites, batch_size=cfg.batch_size, cache=cfg.cache_states, progress=progress,
                   desc="subject states")
    return torch.stack([acts[s] for s in sites])


def subject_token_counts(lm: LanguageModel, subjects: list[str], cfg: LlmSuperpositionConfig) -> np.ndarray:
    """(n_subjects,) tokens of each subject in the prompt."""
    probe = Relation("subjects", [cfg.prompt], [(s, "-") for s in subjects])
    return np.array([p.subject_last - p.subject_first + 1
                     for p in build_prompts(probe, lm.tokenizer, lm.bos_id, k=0)], dtype=np.float64)


def __getattr__(name: str):
    if name == "SuperpositionConfig":  # the name before the LLM and fact-model configs got one name each
        import warnings

        warnings.warn("mechfact.llm SuperpositionConfig is now LlmSuperpositionConfig (SuperpositionConfig is the "
                      "fact model's, in mechfact.probes.experiments)", DeprecationWarning, stacklevel=2)
        return LlmSuperpositionConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
