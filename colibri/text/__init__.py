"""colibri.text: the neutral text pieces every part of colibri shares.

The tokenizer (a byte-level BPE read from ``tokenizer.json``) and the GLM chat format. They
import only the standard library and ``regex``, so the engine, its backends, the server's token
counting and the conformance suite all use them without reaching into one another.
"""

from colibri.text.tokenizer import Tokenizer

__all__ = ["Tokenizer"]
