"""tools/prepare_llama_cpp_gguf.py: what it hands llama.cpp's converter (the converter itself
needs torch and is not run here)."""

from __future__ import annotations

import importlib.util
import io
import json
import tarfile
from pathlib import Path
from types import ModuleType

TOOL = Path(__file__).resolve().parents[2] / "tools" / "prepare_llama_cpp_gguf.py"


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("prepare_llama_cpp_gguf", TOOL)
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


def test_the_driver_answers_a_known_pre_tokenizer() -> None:
    tool = load_tool()
    driver = tool._DRIVER.format(pre=tool.KNOWN_PRE_TOKENIZER)
    compile(driver, "driver", "exec")
    assert "get_vocab_base_pre = lambda self, tokenizer: 'glm4'" in driver
