"""The GPT-2 byte-level alphabet: every byte gets a printable Unicode character.

Byte-level BPE vocabularies (GPT-2, cl100k, GLM-5) store tokens as strings over this
alphabet, so a token can hold any byte sequence, including partial UTF-8 characters.
Printable bytes (33-126, 161-172, 174-255) stand for themselves; the other 68 bytes are
moved, in byte order, to the code points 256, 257, ... (so a space is ``Ġ``, U+0120).
"""

from __future__ import annotations


def _build_byte_to_char() -> tuple[str, ...]:
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars: dict[int, str] = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in chars:
            chars[byte] = chr(256 + shifted)
            shifted += 1
    return tuple(chars[byte] for byte in range(256))


#: ``BYTE_TO_CHAR[b]`` is the alphabet character that stands for byte ``b``.
BYTE_TO_CHAR: tuple[str, ...] = _build_byte_to_char()

#: The inverse of :data:`BYTE_TO_CHAR`.
CHAR_TO_BYTE: dict[str, int] = {char: byte for byte, char in enumerate(BYTE_TO_CHAR)}

_ENCODE_TABLE = {byte: char for byte, char in enumerate(BYTE_TO_CHAR)}


def bytes_to_chars(data: bytes) -> str:
    """The alphabet string standing for ``data``."""
    return data.decode("latin-1").translate(_ENCODE_TABLE)


def chars_to_bytes(token: str) -> bytes:
    """The bytes a vocabulary token stands for.

    A token holding a character outside the alphabet is taken as literal UTF-8 text, as
    HF ``tokenizers``' ByteLevel decoder does, rather than silently losing characters.
    """
    try:
        return bytes([CHAR_TO_BYTE[char] for char in token])
    except KeyError:
        return token.encode("utf-8")
