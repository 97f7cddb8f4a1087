"""mechfact: mechanistic interpretability of factual recall.

Synthetic memories (linear associative memories, one-layer transformers) and
pretrained LLMs are probed with the same hook-based analyses.
"""

__version__ = "0.1.0"
