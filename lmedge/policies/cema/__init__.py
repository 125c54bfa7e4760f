"""CEMA-Router: memetic batch routing over quality, cost, energy and completion time."""

from lmedge.policies.cema import dataset
from lmedge.policies.cema.evaluator import BatchEvaluator, Gene, Weights
from lmedge.policies.cema.quality import (
    PriorQualityPredictor,
    QualityPredictor,
    RagQualityPredictor,
    StoreParams,
    StoreQualityPredictor,
    rag_available,
)
from lmedge.policies.cema.router import NAME, CemaParams, CemaRouter, build

__all__ = [
    "NAME",
    "BatchEvaluator",
    "CemaParams",
    "CemaRouter",
    "Gene",
    "PriorQualityPredictor",
    "QualityPredictor",
    "RagQualityPredictor",
    "StoreParams",
    "StoreQualityPredictor",
    "Weights",
    "build",
    "dataset",
    "rag_available",
]
