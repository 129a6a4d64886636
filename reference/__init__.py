"""colibri.reference: the plain-numpy engine that defines correct behaviour."""

from colibri.reference.tokenizer import Tokenizer

__all__ = ["Tokenizer"]
