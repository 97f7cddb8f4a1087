"""Geometric factual recall (paper B): fact worlds, one-layer models, constructions, training."""

from . import hooks
from .construct import build_cot, build_single_hop, min_block_size
from .evaluate import evaluate, greedy_chain
from .model import FactModel, FactModelConfig
from .train import TrainConfig, train
from .world import IGNORE, FactWorld, Queries

__all__ = ["hooks", "FactWorld", "Queries", "IGNORE", "FactModel", "FactModelConfig", "evaluate", "greedy_chain",
           "build_single_hop", "build_cot", "min_block_size", "TrainConfig", "train"]
