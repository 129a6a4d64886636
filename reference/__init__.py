"""colibri.reference: the plain-numpy engine that defines correct behaviour."""

from colibri.reference.config import ModelConfig
from colibri.reference.errors import CheckpointError
from colibri.reference.experts import ExpertStore, ExpertWeights, MappedExpertStore
from colibri.reference.kv_cache import KVState
from colibri.reference.model import Model, load_model

from colibri.text.tokenizer import Tokenizer

__all__ = [
    "CheckpointError",
    "ExpertStore",
    "ExpertWeights",
    "KVState",
    "MappedExpertStore",
    "Model",
    "ModelConfig",
    "Tokenizer",
    "load_model",
]
