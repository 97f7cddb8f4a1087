"""Tiny random Llama / Qwen2 / Qwen3 / Phi-3 checkpoints for the LLM tests (no downloads).

Pitfalls avoided (see shared ENVIRONMENT.md): a byte-level BPE tokenizer trained
in code (a WordLevel one gets swapped for Qwen2Tokenizer), vocab_size !=
hidden_size, the tokenizer saved to disk and reloaded, Phi-3's special token
ids set explicitly.
"""

from __future__ import annotations

import json
from pathlib import Path

FAMILIES = ("llama", "qwen2", "qwen3", "phi3")
HIDDEN = 48
VOCAB = 320

# A tiny relation set in the shipped format (subjects are nonsense words: no model knows them).
TINY_RELATIONS = {
    "tiny_colour": {
        "name": "tiny_colour", "kind": "many_to_one", "description": "made-up things and their colour",
        "prompt_templates": ["The colour of {} is", "{} has the colour"],
        "samples": [{"subject": s, "object": o} for s, o in [
            ("zorb", "red"), ("plim", "blue"), ("quax", "green"), ("vint", "red"), ("dral", "blue"),
            ("kelp", "green"), ("mirk", "red"), ("snov", "blue"), ("trel", "green"), ("yump", "red"),
            ("gorp", "blue"), ("fesk", "green")]],
    },
    "tiny_capital": {
        "name": "tiny_capital", "kind": "one_to_one", "description": "made-up countries and capitals",
        "prompt_templates": ["The capital of {} is", "{}'s capital is"],
        "samples": [{"subject": s, "object": o} for s, o in [
            ("Zorbia", "Zo"), ("Plimland", "Pla"), ("Quaxia", "Qua"), ("Vintor", "Vi"), ("Dralia", "Dra"),
            ("Kelpos", "Ke"), ("Mirkan", "Mi"), ("Snovia", "Sno"), ("Trelos", "Tre"), ("Yumpa", "Yu")]],
    },
}


def write_relations(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, rel in TINY_RELATIONS.items():
        (folder / f"{name}.json").write_text(json.dumps(rel, indent=1))
    return folder


def _corpus() -> list[str]:
    from mechfact.llm.relations import load_relations

    lines = []
    rels = load_relations()
    for rel in rels:
        for t in rel.prompt_templates:
            lines += [f"{t.format(s)} {o}" for s, o in zip(rel.subjects, rel.objects)]
    for rel in TINY_RELATIONS.values():
        for t in rel["prompt_templates"]:
            lines += [f"{t.format(s['subject'])} {s['object']}" for s in rel["samples"]]
    return lines


def build_tokenizer(folder: Path):
    """A byte-level BPE tokenizer with VOCAB entries, saved to ``folder`` and reloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def build_model(family: str, folder: Path) -> Path:
    """Save a tiny random ``family`` model + tokenizer in ``folder``."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Phi3Config, Qwen2Config, Qwen3Config

    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(folder)
    vocab = len(tok)
    assert vocab != HIDDEN
    common = dict(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                  tie_word_embeddings=False)
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "phi3": Phi3Config}[family]
    if family == "qwen3":
        common["head_dim"] = HIDDEN // 4
    cfg = cls(**common)
    torch.manual_seed({"llama": 1, "qwen2": 2, "qwen3": 3, "phi3": 4}[family])
    model = AutoModelForCausalLM.from_config(cfg).eval()
    model.save_pretrained(folder)
    return folder


def build_gemma3(folder):
    """A tiny random Gemma-3 text model + tokenizer in ``folder`` (sliding window 4, two layer types)."""
    import torch
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(folder)
    cfg = Gemma3TextConfig(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=4,
                           layer_types=["sliding_attention", "full_attention"] * 2, query_pre_attn_scalar=24,
                           max_position_embeddings=256, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                           pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(5)
    AutoModelForCausalLM.from_config(cfg).eval().save_pretrained(folder)
    return folder


def train_to_know(folder: Path, relations: Path, steps: int = 150) -> Path:
    """Train the tiny checkpoint in ``folder`` (full batch, Adam, seed 0) until it answers the zero-shot prompts of
    ``relations`` (every fact known), and save it back. The target is the object's own first token: the tiny
    tokenizer often splits ``" " + object`` into a bare space first, and the object's first token is a prefix of it
    (the LRE authors' match)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mechfact.llm.prompts import build_prompts
    from mechfact.llm.relations import load_relations
    from mechfact.probes.queries import pad_batch

    tok = AutoTokenizer.from_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder)
    prompts = [p for rel in load_relations(relations) for p in build_prompts(rel, tok, tok.bos_token_id, k=0)]
    toks, mask, _, _ = pad_batch([p.tokens for p in prompts], tok.pad_token_id)
    last = torch.tensor([len(p.tokens) - 1 for p in prompts])
    y = torch.tensor([tok(p.object, add_special_tokens=False)["input_ids"][0] for p in prompts])
    torch.manual_seed(0)
    opt = torch.optim.Adam(hf.parameters(), lr=1e-2)
    hf.train()
    for _ in range(steps):
        logits = hf(toks, attention_mask=mask).logits[torch.arange(len(prompts)), last]
        loss = torch.nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    hf.eval()
    hf.save_pretrained(folder)
    return folder
