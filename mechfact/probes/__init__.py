"""Probes written once for every model with the transformer-lens hook interface.

The same functions take the one-layer fact models of :mod:`mechfact.facts` and
pretrained models booted through ``TransformerBridge`` (:mod:`mechfact.llm`).
"""
