"""Turn whatever names a model (a folder, a packaged model's name, a GGUF file, a hub id) into
something `from_pretrained` loads: `resolve_model` is the one call every loader makes."""

from __future__ import annotations

import importlib
import importlib.util
import tempfile
from pathlib import Path

from reinforge.models.cache import cached_folder, gguf_cache_name, publish
from reinforge.models.errors import ModelPackageMissingError, ModelSourceError
from reinforge.models.registry import PACKAGED_MODELS, PackagedModel


def resolve_model(name_or_path: str | Path) -> str:
    """A local folder as is; a packaged model's name or a `.gguf` file -> its cached Hugging Face
    folder (converted on first use); anything else unchanged, as a hub id for `from_pretrained`."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return str(path)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelSourceError(f"there is no GGUF file {path}")
        return str(prepare_gguf(path))
    name = str(name_or_path)
    if name in PACKAGED_MODELS:
        return str(prepare_packaged(PACKAGED_MODELS[name]))
    return name


def prepare_packaged(model: PackagedModel) -> Path:
    """The packaged model's cached folder, converted from the package's GGUF if not there yet."""
    found = cached_folder(model.name)
    if found is not None:
        return found

    def write(out_dir: Path) -> None:
        from reinforge.models.convert import convert_gguf, gguf_architecture  # torch: only to convert

        with tempfile.TemporaryDirectory(dir=out_dir.parent) as scratch:
            gguf = packaged_gguf(model, Path(scratch))
            architecture = gguf_architecture(gguf)
            if architecture != model.family:
                raise ModelSourceError(
                    f"{gguf}: architecture {architecture!r}, but {model.name} should be {model.family!r}"
                )
            convert_gguf(gguf, out_dir)

    return publish(model.name, write)


def prepare_gguf(path: Path) -> Path:
    """The GGUF file's cached folder (named after the file's stem and content digest)."""
    name = gguf_cache_name(path)
    found = cached_folder(name)
    if found is not None:
        return found
    from reinforge.models.convert import convert_gguf  # torch and transformers: only to convert

    return publish(name, lambda out_dir: convert_gguf(path.resolve(), out_dir))


def packaged_gguf(model: PackagedModel, scratch: Path) -> Path:
    """The GGUF file the model's package ships (or assembles into `scratch`)."""
    spec = importlib.util.find_spec(model.module)  # locates without importing (and its plugin imports)
    if spec is None or not spec.submodule_search_locations:
        raise ModelPackageMissingError(
            f"the model {model.name!r} comes with the pip package {model.distribution!r}, which is not "
            f"installed: pip install 'reinforge[{model.extra}]'"
        )
    if model.gguf_file is not None:
        path = Path(next(iter(spec.submodule_search_locations))) / model.gguf_file
        if not path.is_file():
            raise ModelSourceError(f"the package {model.distribution!r} has no file {model.gguf_file}")
        return path
    assert model.assemble is not None
    try:
        assemble = getattr(importlib.import_module(model.module), model.assemble)
        return Path(assemble(output_path=scratch / f"{model.name}.gguf"))
    except ImportError as exc:  # a chunk package is missing
        raise ModelPackageMissingError(
            f"the model {model.name!r} needs every chunk package of {model.distribution!r} ({exc}): "
            f"pip install 'reinforge[{model.extra}]'"
        ) from exc
    except (OSError, ValueError) as exc:
        raise ModelSourceError(f"{model.distribution} could not assemble {model.name}: {exc}") from exc
