"""Hugging Face models from a profile, no factory to write:

    [model]
    hf = "bert-base-uncased"            # a model id, or a folder written by save_pretrained (relative to the profile)
    hf_config = { model_type = "bert", hidden_size = 64, ... }   # or: a config, random weights, nothing downloaded
    task = "sequence-classification"    # the head: base (default), sequence-classification, token-classification,
                                        # masked-lm, causal-lm, image-classification

The profile's inputs are passed to the model's forward by name (input_ids, attention_mask,
token_type_ids, position_ids, pixel_values, ...), in the profile's order. A decoder's KV cache is
exported as `[export] cache` says (pipeline/models/decoder.py). transformers is the
optional extra `.[hf]`, imported here only, at call time.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError, ProfileError, first_line
from pipeline.core.fileio import sha256_file
from pipeline.core.profiles import Profile
from pipeline.models.size import check_fits, small_config_fields

AUTO_CLASSES = {
    "base": "AutoModel",
    "sequence-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "masked-lm": "AutoModelForMaskedLM",
    "causal-lm": "AutoModelForCausalLM",
    "image-classification": "AutoModelForImageClassification",
}


def build_hf_model(profile: Profile) -> Any:
    """The profile's Hugging Face model in eval mode, its forward taking the profile's inputs in order
    (a decoder's cache as `[export] cache` says: pipeline/models/decoder.py)."""
    from pipeline.models.decoder import prepare

    return prepare(load_hf_model(profile), profile)[0]


def load_hf_model(profile: Profile) -> Any:
    """The profile's Hugging Face model as transformers builds it (hf / hf_config, task).

    Its forward is later replaced on the instance rather than wrapped in another module, so the
    exported node names keep the model's own scopes (/encoder/layer.0/...)."""
    transformers = _transformers(f"{profile.source}: model.hf/hf_config")
    section, where = profile.model, f"{profile.source}: model"
    task = section.task or "base"
    auto = getattr(transformers, AUTO_CLASSES[task])
    if section.hf_config is not None:
        fields = dict(section.hf_config)
        model_type = fields.pop("model_type")
        try:
            config = transformers.AutoConfig.for_model(model_type, **fields)
        except (ValueError, TypeError) as err:
            raise ProfileError(f"{where}.hf_config: {_first_line(err)}") from err
        try:
            check_fits(auto, config, f"{where}.hf_config ({model_type})")
            model = auto.from_config(config)
            settle_batch_norm(model, profile)
        except ValueError as err:
            raise ProfileError(f"{where}.task: transformers has no {task} model for model_type {model_type!r}; choose another task") from err
        except (IndexError, KeyError, TypeError, AttributeError, AssertionError) as err:  # fields the config accepted but the model cannot use together
            raise ProfileError(f"{where}.hf_config: transformers cannot build a {model_type} model from these fields "
                               f"({type(err).__name__}: {_first_line(err)}); make the fields agree (e.g. one depth per "
                               f"stage, num_stages = len(depths)), see {type(config).__name__} in transformers' documentation") from err
    else:
        location = local_folder(profile)
        if location is not None:  # a model id's config is only known once downloaded
            _check_folder_fits(transformers, auto, location, f"{where}.hf ({section.hf})")
        try:
            model, loading = auto.from_pretrained(str(location) if location else section.hf, output_loading_info=True)
        except (OSError, ValueError) as err:
            raise ProfileError(
                f"{where}.hf: cannot load {section.hf!r} as {AUTO_CLASSES[task]}: {_first_line(err)}; "
                "give a folder written by save_pretrained (relative to the profile) or a model id this machine can download"
            ) from err
        fresh = sorted({*loading["missing_keys"], *(str(k) for k in loading["mismatched_keys"])})
        if fresh:  # transformers would initialize them at random: never deploy that silently
            raise ProfileError(f"{where}.task: {len(fresh)} weights of the {task} model are not in {section.hf!r} (e.g. {fresh[0]}) and would be random; "
                               "choose the task the checkpoint was saved for (base loads any checkpoint's encoder)")
    return model.eval()


BATCH_NORM_BATCHES = 4


def settle_batch_norm(model: Any, profile: Profile) -> int:
    """Give a random-weight model's BatchNorm layers the running statistics of its own activations
    (BATCH_NORM_BATCHES forward passes of random inputs at the profile's opt shapes, statistics
    averaged), as training leaves them. Fresh from a config they are mean 0 / variance 1, so a net
    whose init does not keep the scale shrinks the signal layer after layer: a MobileNetV2's outputs
    came out near 1e-21, under FP16's smallest value, and its FP16 check read cosine 0. Returns the
    number of BatchNorm layers settled (0: the model is left as it is)."""
    import torch

    from pipeline.core.samples import make_inputs

    layers = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not layers:
        return 0
    for layer in layers:
        layer.reset_running_stats()
        layer.momentum = None  # a cumulative average over the batches
        layer.train()
    with torch.no_grad():
        for i in range(BATCH_NORM_BATCHES):
            feeds = {name: torch.from_numpy(array) for name, array in make_inputs(profile, seed=profile.model.seed + i).items()}
            try:
                model(**feeds)
            except (TypeError, ValueError, RuntimeError, IndexError) as err:  # inputs the model does not take
                raise ProfileError(f"{profile.source}: inputs: the random-weight {type(model).__name__} does not run on the profile's inputs "
                                   f"{', '.join(f'{k} {list(v.shape)}' for k, v in feeds.items())} ({type(err).__name__}: {first_line(err)}); "
                                   "give [[inputs]] the names and shapes its forward takes") from err
    for layer in layers:
        layer.eval()
    return len(layers)


def _check_folder_fits(transformers: Any, auto: Any, folder: Path, where: str) -> None:
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder))
        check_fits(auto, config, where)
    except (OSError, ValueError):
        return  # from_pretrained says what is wrong with the folder


def hf_fingerprint(profile: Profile) -> dict[str, Any]:
    """What decides the exported model: the source (and a local folder's files), the head, transformers' version."""
    from importlib.metadata import PackageNotFoundError, version

    section = profile.model
    folder = local_folder(profile) if section.hf is not None else None
    files = {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file()} if folder else None
    try:
        transformers_version = version("transformers")
    except PackageNotFoundError:
        transformers_version = None
    return {"hf": section.hf, "hf_config": section.hf_config, "task": section.task, "files": files, "transformers": transformers_version}


def local_folder(profile: Profile):
    """The `hf` folder when it names one (relative to the profile's folder), else None (a model id).
    A value written as a path (starting with ".", "/" or "~") must be an existing folder."""
    hf = profile.model.hf
    candidate = profile.folder / Path(hf).expanduser()
    if candidate.is_dir():
        return candidate.resolve()
    if hf.startswith((".", "/", "~")):
        raise ProfileError(f"{profile.source}: model.hf: no folder {candidate}; give a folder written by save_pretrained (relative to the profile) or a model id")
    return None


def _transformers_requirement() -> str:
    """The [hf] extra's transformers pin as installed (so the hint works from any folder), else plain transformers."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        pins = [r.split(";")[0].strip() for r in requires("trt-pipeline") or [] if r.startswith("transformers")]
    except PackageNotFoundError:
        pins = []
    return pins[0] if pins else "transformers"


def _transformers(needed_by: str, error: type[Exception] = ProfileError):
    try:
        import transformers
    except ImportError as err:
        raise error(f'{needed_by} needs transformers: pip install "{_transformers_requirement()}" (the [hf] extra)') from err
    transformers.logging.set_verbosity_error()
    return transformers


def _first_line(err: Exception) -> str:
    """The error's first line, without transformers' list of every known model type."""
    return first_line(err).split(". Should contain one of")[0]


def starter_profile(source: str, task: str, name: str, profile_folder: Path, full_size: bool = False) -> str:
    """The text of a profile for a Hugging Face model: `source` is a save_pretrained folder or a
    model_type (random weights: a small config unless `full_size`). Inputs come from the config and
    the task's forward (ids, mask and token types for text, pixel_values for images; a decoder's KV
    cache as Optimum lays it out), dims from its limits; every choice is commented."""
    transformers = _transformers(f"init --hf {source}", InputError)
    folder = Path(source).expanduser()
    try:
        if folder.is_dir():
            config = transformers.AutoConfig.from_pretrained(str(folder))
            where = Path(os.path.relpath(folder.resolve(), profile_folder.resolve())).as_posix()
            model_lines = [f'hf = "{where}"                 # written by save_pretrained, relative to this file']
        else:
            config = transformers.AutoConfig.for_model(source)
            small = {} if full_size else small_config_fields(config)
            config = transformers.AutoConfig.for_model(source, **small)
            model_lines = ["", "[model.hf_config]                  # random weights from this config: set the sizes of your model",
                           f'model_type = "{source}"']
            if small:
                model_lines += ["# A small config written by init, not the model's default sizes (init --full-size writes those):"]
                model_lines += [f"{key} = {value}" for key, value in small.items()]
    except (OSError, ValueError) as err:
        raise InputError(f"init --hf {source}: neither a folder written by save_pretrained nor a model_type transformers knows ({_first_line(err)})") from err
    if config.is_encoder_decoder:
        raise InputError(f"init --hf {source}: {type(config).__name__.removesuffix('Config')} is an encoder-decoder model; exporting its encoder "
                         "and its decoder with past as two models in one build is not supported yet: write a factory returning "
                         "model.get_encoder() (inputs input_ids, attention_mask) to deploy the encoder, or choose a decoder-only model")
    try:
        model_class = getattr(transformers, AUTO_CLASSES[task])._model_mapping[type(config)]
    except KeyError as err:
        raise InputError(f"init --hf {source}: transformers has no {task} model for model_type {config.model_type!r}; choose another --task") from err
    accepted = inspect.signature(model_class.forward).parameters
    decoder = False
    if "pixel_values" in accepted:
        size = getattr(config, "image_size", 224)
        size = size if isinstance(size, int) else size[0]
        dims = {"batch": (1, 4, 16)}
        inputs = [("pixel_values", "float32", f'["batch", {config.num_channels}, {size}, {size}]', "", "images, channels first")]
    elif "input_ids" in accepted:
        decoder = _returns_cache(model_class, config)
        positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 512
        longest = min(positions // 2 if decoder else positions, 512)  # a decoder keeps positions for its cache
        dims = {"batch": (1, 4, 16), "seq": (1 if decoder else min(8, longest), min(16 if decoder else 128, longest), longest)}
        inputs = [("input_ids", "int64", '["batch", "seq"]', f"range = [0, {config.vocab_size}]", "token ids inside the vocabulary")]
        if "attention_mask" in accepted:
            inputs.append(("attention_mask", "int64", '["batch", "seq"]', 'fill = "mask"', "1 for tokens, 0 for padding at the end"))
        if "token_type_ids" in accepted and (getattr(config, "type_vocab_size", 0) or 0) > 1:
            inputs.append(("token_type_ids", "int64", '["batch", "seq"]', f"range = [0, {config.type_vocab_size}]", "segment ids"))
    else:
        raise InputError(f"init --hf {source}: {model_class.__name__}.forward takes neither input_ids nor pixel_values; write the profile's [[inputs]] by hand")
    if decoder:
        dims, inputs = _with_past_inputs(dims, inputs, config, accepted)
    lines = [f"# Starter profile for {model_class.__name__} (python -m pipeline init --hf {source}).",
             "# Set [dims] to the shapes you deploy (TensorRT builds for min..max, tuned for opt).",
             f'name = "{name}"', "", "[model]", f'task = "{task}"', "seed = 0"]
    lines += model_lines
    for dim, (low, opt, high) in dims.items():
        lines += ["", f"[dims.{dim}]", f"min = {low}", f"opt = {opt}", f"max = {high}"]
    for input_name, dtype, shape, fill, comment in inputs:
        lines += ["", f"[[inputs]]                         # {comment}", f'name = "{input_name}"', f'dtype = "{dtype}"', f"shape = {shape}"]
        lines += [fill] if fill else []
    lines += ["", "[export]", 'exporter = "dynamo"', "opset = 20"]
    if decoder:
        lines += ['cache = "with-past"                # one graph for prefill (past_seq = 0) and decode; "none": no KV cache']
    return "\n".join(lines) + "\n"


def _returns_cache(model_class: Any, config: Any) -> bool:
    """The model returns a KV cache (pipeline/models/decoder.py), tried on the meta device: no memory, any size."""
    import torch

    from pipeline.models.decoder import returns_cache

    if "past_key_values" not in inspect.signature(model_class.forward).parameters:
        return False
    with torch.device("meta"):
        model = model_class(config)
    return returns_cache(model)


def _with_past_inputs(dims: dict, inputs: list, config: Any, accepted: Any) -> tuple[dict, list]:
    """A decoder's starter dims and inputs with its KV cache (pipeline/models/decoder.py lays them out)."""
    import tomllib

    from pipeline.models.decoder import with_past_profile

    comments = {"input_ids": "new token ids", "attention_mask": "1 per past and new token, 0 for padding",
                "position_ids": "positions of the new tokens", "past_key_values": "the KV cache: [batch, kv_heads, past_seq, head_dim]"}
    text = "\n".join([f"[dims.{d}]\nmin = {lo}\nopt = {op}\nmax = {hi}" for d, (lo, op, hi) in dims.items()]
                     + [f'[[inputs]]\nname = "{n}"\ndtype = "{t}"\nshape = {shape}\n{fill}' for n, t, shape, fill, _ in inputs])
    base = Profile.model_validate({"name": "starter", "model": {"hf_config": {"model_type": config.model_type}}, **tomllib.loads(text)})
    derived = with_past_profile(base, config, accepted)
    dims = {d: (r.min, r.opt, r.max) for d, r in derived.dims.items()}
    rows = []
    for spec in derived.inputs:
        fill = f"range = [{int(spec.range[0])}, {int(spec.range[1])}]" if spec.range else f'fill = "{spec.fill}"' if spec.fill != "random" else ""
        shape = "[" + ", ".join(f'"{s}"' if isinstance(s, str) else str(s) for s in spec.shape) + "]"
        rows.append((spec.name, spec.dtype, shape, fill, comments.get(spec.name.split(".")[0], "")))
    return dims, rows

