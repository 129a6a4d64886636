"""tools/llama_cpp_gguf.py: what it hands llama.cpp's converter (the converter itself
needs torch and is not run here)."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import numpy as np
from colibri.reference.safetensors import read_all, write_safetensors

TOOL = Path(__file__).resolve().parents[2] / "tools" / "llama_cpp_gguf.py"


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("llama_cpp_gguf", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_staging_dir_links_the_checkpoint_beside_the_fixture_tokenizer(tmp_path: Path) -> None:
    tool = load_tool()
    model = tmp_path / "glm5-bench-1"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 8192}))
    (model / "generation_config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    stage = tool.staging_dir(model, tmp_path / "gguf")
    assert stage == tmp_path / "gguf" / "stage-glm5-bench-1"
    assert (stage / "model.safetensors").is_symlink()
    assert (stage / "model.safetensors").read_bytes() == b"weights"
    added = json.loads((stage / "tokenizer.json").read_text())["added_tokens"]
    # The converter's GLM vocabulary step looks these up by name.
    names = {t["content"] for t in added}
    assert {"[gMASK]", "<|user|>", "<|endoftext|>", "<|observation|>"} <= names
    assert tool.staging_dir(model, tmp_path / "gguf") == stage  # rerunnable


def test_converter_source_takes_only_the_converter_from_the_sdist(tmp_path: Path) -> None:
    tool = load_tool()
    sdist = tmp_path / "llama_cpp_python-0.0.tar.gz"
    files = {
        "llama_cpp_python-0.0/vendor/llama.cpp/convert_hf_to_gguf.py": b"# converter",
        "llama_cpp_python-0.0/vendor/llama.cpp/conversion/base.py": b"# base",
        "llama_cpp_python-0.0/vendor/llama.cpp/gguf-py/gguf/__init__.py": b"# gguf",
        "llama_cpp_python-0.0/vendor/llama.cpp/ggml/src/big.c": b"/* not needed */",
    }
    with tarfile.open(sdist, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    src = tool.converter_source(sdist, tmp_path / "src")
    assert (src / "convert_hf_to_gguf.py").read_bytes() == b"# converter"
    assert (src / "conversion" / "base.py").is_file()
    assert (src / "gguf-py" / "gguf" / "__init__.py").is_file()
    assert not (src / "ggml").exists()


def test_the_driver_answers_a_known_pre_tokenizer_only_for_an_unknown_hash(
        tmp_path: Path) -> None:
    tool = load_tool()
    driver = tool._DRIVER.format(pre=tool.KNOWN_PRE_TOKENIZER)
    # A stand-in converter: its check knows one hash ("known") and raises for the rest, as
    # llama.cpp's does; the driver must keep the known answer and map only the unknown one.
    src = tmp_path / "src"
    (src / "conversion").mkdir(parents=True)
    (src / "gguf-py").mkdir()
    (src / "conversion" / "__init__.py").write_text("")
    (src / "conversion" / "base.py").write_text(
        "class TextModel:\n"
        "    def get_vocab_base_pre(self, tokenizer):\n"
        "        if tokenizer == 'known':\n"
        "            return 'llama-bpe'\n"
        "        raise NotImplementedError(tokenizer)\n")
    (src / "convert_hf_to_gguf.py").write_text(
        "import sys\nfrom conversion.base import TextModel\n"
        "print([TextModel().get_vocab_base_pre(t) for t in sys.argv[1:]])\n")
    done = subprocess.run([sys.executable, "-c", driver, str(src), "known", "new"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "['llama-bpe', 'glm4']"


def test_a_narrow_indexer_is_staged_at_llama_cpp_s_width(tmp_path: Path) -> None:
    tool = load_tool()
    model = tmp_path / "fixture"
    model.mkdir()
    config = {"index_head_dim": 16, "index_n_heads": 2, "q_lora_rank": 8, "hidden_size": 12}
    (model / "config.json").write_text(json.dumps(config))
    p = "model.layers.0.self_attn."
    stored = {p + "indexer.wq_b.weight": np.ones((32, 8), np.float32),
              p + "indexer.wk.weight": np.ones((16, 12), np.float32),
              p + "indexer.k_norm.weight": np.ones(16, np.float32),
              p + "indexer.k_norm.bias": np.ones(16, np.float32),
              p + "kv_a_layernorm.weight": np.arange(4, dtype=np.float32)}
    write_safetensors(model / "model.safetensors", stored)
    (model / "tokenizer.json").write_text('{"own": true}')
    stage = tool.staging_dir(model, tmp_path / "gguf")
    assert json.loads((stage / "config.json").read_text())["index_head_dim"] == 64
    assert json.loads((stage / "tokenizer.json").read_text()) == {"own": True}
    assert not (stage / "model.safetensors").is_symlink()
    staged = read_all(stage / "model.safetensors")
    assert staged[p + "indexer.wq_b.weight"].shape == (128, 8)
    assert staged[p + "indexer.wk.weight"].shape == (64, 12)
    assert (staged[p + "indexer.k_norm.weight"] == 1).all()
    assert staged[p + "indexer.k_norm.bias"].shape == (64,)
    assert (staged[p + "kv_a_layernorm.weight"] == stored[p + "kv_a_layernorm.weight"]).all()
