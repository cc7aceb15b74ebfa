"""What the experiment config reads of the workloads, in one place: the named model flavours, a
model's shape (named, or from a Hugging Face directory), and the checks of its inputs (model
files, tokenizer, dataset files). Each check raises `WorkloadError` with the problem; the config
names the field. The heavier modules (safetensors, tokenizers, pyarrow) are imported only when a
check needs them, so `copus validate` stays quick."""

from __future__ import annotations

from workloads.flavours import BYTE_VOCAB, FLAVOURS, ModelFlavour

__all__ = ["BYTE_VOCAB", "WorkloadError", "check_model_files", "dataset_files", "flavour_names", "model_flavour"]


class WorkloadError(ValueError):
    """A workload input that cannot be used, and why."""


def flavour_names() -> list[str]:
    return sorted(FLAVOURS)


def model_flavour(model: str | None, init_from: str | None) -> ModelFlavour:
    """The model's shape: the named flavour, or the Hugging Face directory's config.json."""
    from workloads.hf_config import HFModelError, workload_flavour

    try:
        return workload_flavour(model, init_from)
    except HFModelError as err:
        raise WorkloadError(str(err)) from None


def check_model_files(init_from: str, flavour: ModelFlavour) -> None:
    """A Hugging Face directory's safetensors files hold every tensor of the model, in shape."""
    from workloads.hf_config import HFModelError
    from workloads.hf_files import check_weights

    try:
        check_weights(init_from, flavour)
    except HFModelError as err:
        raise WorkloadError(str(err)) from None


def tokenizer_size(path: str) -> int:
    """The vocabulary of a tokenizer file or directory."""
    from workloads.tokenizer import TokenizerError, tokenizer_vocab_size

    try:
        return tokenizer_vocab_size(path)
    except TokenizerError as err:
        raise WorkloadError(str(err)) from None


def dataset_files(path: str, kind: str) -> list:
    """The files a dataset path (a file, a directory or a pattern) stands for; empty: none."""
    from workloads.prepare import source_files

    return source_files(path, kind)
