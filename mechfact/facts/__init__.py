"""Geometric factual recall (paper B): fact worlds, one-layer models, constructions, the trainer, regimes."""

from .construct import ConstructResult, build_cot, build_single_hop, construct, min_block_size
from .evaluate import EvalResult, evaluate, greedy_chain
from .model import FactModel, FactModelConfig, build_fact_model
from .regimes import REGIMES, Regime
from .train import TrainConfig, TrainResult, train
from .world import IGNORE, FactWorld, Queries

__all__ = ["FactWorld", "Queries", "IGNORE", "FactModel", "FactModelConfig", "build_fact_model", "evaluate",
           "greedy_chain", "build_single_hop", "build_cot", "construct", "min_block_size", "TrainConfig", "train",
           "Regime", "REGIMES", "EvalResult", "TrainResult", "ConstructResult"]
