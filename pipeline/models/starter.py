"""`init --hf SOURCE`: a starter profile for a Hugging Face model (a model_type, random weights from init's
small config, or a save_pretrained folder), written only once the model built from it runs at the profile's
max dims. pipeline/models/hf.py loads the model a profile names; this module writes the profile.
"""

from __future__ import annotations

import inspect
import os
import tempfile
from pathlib import Path
from typing import Any

import tomlkit

from pipeline.core.budget import OutOfTime, TimeBudget, step
from pipeline.core.errors import InputError, PipelineError, first_line
from pipeline.core.memory import available_bytes
from pipeline.core.profiles import ExportSection, Profile
from pipeline.models.decoder import max_positions, prepare, returns_cache, with_past_profile
from pipeline.models.hf import AUTO_CLASSES, import_transformers, load_hf_model, short_error
from pipeline.models.seq2seq_starter import EXPORT, EXPORT_COMMENT, encoder_decoder_inputs, run_encoder_decoder, task_of
from pipeline.models.size import export_peak_bytes, per_layer_fields, small_config_fields
from pipeline.models.trial import DEFAULT_SECONDS, SECONDS_ENV, feed_noise, random_draws, run_at_max


def starter_profile(source: str, task: str | None, name: str, profile_folder: Path, full_size: bool = False,
                    seconds: float = DEFAULT_SECONDS) -> str:
    """The text of a profile for a save_pretrained folder or a model_type (random weights, a small config unless
    `full_size`): inputs from the config and the task's forward, dims from its limits, every choice commented. Done
    within `seconds`, else refused naming the step that ran out."""
    try:
        with TimeBudget(seconds, "importing transformers and making the config"):
            return _starter_profile(source, task, name, profile_folder, full_size)
    except OutOfTime as out:
        raise InputError(f"init --hf {source}: {out.step} did not finish within init's time budget of {out.seconds:g} s; "
                         f"allow more (init --budget SECONDS, or {SECONDS_ENV}) or write the profile by hand (see docs/models.md)") from None


def _starter_profile(source: str, task: str | None, name: str, profile_folder: Path, full_size: bool) -> str:
    transformers = import_transformers(f"init --hf {source}", InputError)
    folder = Path(source).expanduser()
    model: dict[str, Any] = {"task": task, "seed": 0}  # task: None until the config says (base, or an encoder-decoder's)
    if folder.is_dir():
        model["hf"] = Path(os.path.relpath(folder.resolve(), profile_folder.resolve())).as_posix()
    try:
        return _starter_text(transformers, source, task, name, profile_folder, full_size, folder, model, cut_lists=True)
    except InputError:
        if folder.is_dir() or full_size or not _cuts_lists(transformers, source):
            raise
    # a fixed number of stages (mobilevit, levit): the per-stage lists at their own length, still a small model
    return _starter_text(transformers, source, task, name, profile_folder, full_size, folder, model, cut_lists=False)


def _cuts_lists(transformers: Any, model_type: str) -> bool:
    try:
        default = transformers.AutoConfig.for_model(model_type)
        return small_config_fields(default) != small_config_fields(default, cut_lists=False)
    except Exception:  # noqa: BLE001 - refused already, with its line (a config whose fields cannot be read)
        return False


def _starter_text(transformers: Any, source: str, task: str | None, name: str, profile_folder: Path, full_size: bool, folder: Path,
                  model: dict[str, Any], cut_lists: bool) -> str:
    config, hf_config = _starter_config(transformers, source, folder, full_size, cut_lists)
    task = model["task"] = task_of(transformers, source, config, task)
    try:
        model_class = getattr(transformers, AUTO_CLASSES[task])._model_mapping[type(config)]
        model_class = model_class[0] if isinstance(model_class, tuple) else model_class  # funnel: (FunnelModel, FunnelBaseModel), as transformers picks
    except (KeyError, ValueError) as err:  # ValueError: a class transformers maps but does not have (voxtral_realtime_text)
        raise InputError(f"init --hf {source}: transformers has no {task} model for model_type {config.model_type!r}; choose another --task") from err
    try:
        if config.is_encoder_decoder:
            dims, inputs, decoder = (*encoder_decoder_inputs(config, task), False)
        else:
            dims, inputs, decoder = _starter_inputs(source, model_class, config, small=bool(hf_config) and not full_size)
    except PipelineError:
        raise
    except Exception as err:  # noqa: BLE001 - transformers' config and model, not ours (a composite config has no num_channels, ...)
        raise InputError(f"init --hf {source}: cannot derive {model_class.__name__}'s inputs from its config ({type(err).__name__}: {short_error(err)}); "
                         f"{_parts(config)}write its [[inputs]] by hand (see docs/models.md)") from err
    document = _starter_document(f"{model_class.__name__} (python -m pipeline init --hf {source})", name, model, hf_config, dims, inputs,
                                 "encoder-decoder" if config.is_encoder_decoder else "decoder" if decoder else "")
    if not full_size:  # a default config's model may not fit this machine: its user sizes it
        _check_runs(source, document, profile_folder / f"{name}.toml", decoder, checkpoint=folder.is_dir(), parts=_parts(config))
    return tomlkit.dumps(document)


def _parts(config: Any) -> str:
    """A composite config's parts' model types (text_config, vision_config), which init writes profiles for one at a time."""
    parts = {name: getattr(getattr(config, name, None), "model_type", None) for name in getattr(config, "sub_configs", None) or {}}
    named = [f"{name} is {kind}" for name, kind in parts.items() if kind]
    return f"it combines models ({', '.join(named)}): init --hf one of those, or " if named else ""


def _starter_config(transformers: Any, source: str, folder: Path, full_size: bool, cut_lists: bool) -> tuple[Any, dict[str, Any]]:
    """The config of a save_pretrained folder or a model_type (small unless `full_size`), and the hf_config fields written for it."""
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder)) if folder.is_dir() else transformers.AutoConfig.for_model(source)
    except (OSError, ValueError) as err:
        raise InputError(f"init --hf {source}: neither a folder written by save_pretrained nor a model_type transformers knows ({short_error(err)})") from err
    except Exception as err:  # noqa: BLE001 - transformers' own validation of its default config
        raise InputError(f"init --hf {source}: transformers cannot make its config ({type(err).__name__}: {short_error(err)}); "
                         "there is no default to start from: write its hf_config by hand") from err
    if folder.is_dir():
        return config, {}
    config, small = (config, {}) if full_size else _small_config(transformers, source, config, cut_lists)
    return config, {"model_type": source, **small}


def _check_runs(source: str, document: Any, path: Path, decoder: bool, checkpoint: bool, parts: str = "") -> None:
    """Build the starter profile's model and run it at the profile's max dims (pipeline/models/trial.py), so that a profile
    `init` writes works; an encoder's seq max first lowered to the longest it takes (xlm-roberta's positions start after
    its padding index). A model that does not build or run is refused in one line."""
    import torch

    profile = Profile.model_validate({**document.unwrap(), "source": path})
    model: Any = None
    try:
        with step(f"{'loading' if checkpoint else 'building'} the model"):
            model = load_hf_model(profile)
        sizes = {"batch": 1} if checkpoint else None
        with torch.no_grad():
            if profile.encoder_decoder:
                with step(f"running {type(model).__name__} at the profile's max dims"):
                    run_encoder_decoder(model, profile, sizes)
                return
            if not decoder and "seq" in profile.dims:
                with step(f"finding the longest sequence {type(model).__name__} takes"):
                    longest = _longest_sequence(model, profile)
                if longest < profile.dims["seq"].max:
                    seq = document["dims"]["seq"]
                    seq["max"], seq["opt"], seq["min"] = longest, min(seq["opt"], longest), min(seq["min"], longest)
                    seq.comment(f"the longest sequence {type(model).__name__} takes")
                    profile = Profile.model_validate({**document.unwrap(), "source": path})
            bound, export_profile = prepare(model, profile)
            with random_draws() as draws:
                run_at_max(type(model).__name__, bound, export_profile, batch_one=checkpoint)
            if feed_noise(model, draws, document):
                del model.forward  # bind_forward's, set on the instance: bound again to the inputs with the noise
                profile = Profile.model_validate({**document.unwrap(), "source": path})
                run_at_max(type(model).__name__, *prepare(model, profile), batch_one=checkpoint)
            model_name = type(model).__name__
    except PipelineError as err:
        raise InputError(f"init --hf {source}: {str(err).removeprefix(f'{path}: ')}") from err
    except Exception as err:  # noqa: BLE001 - transformers' model, not ours: any failure is the model's limit
        raise InputError(f"init --hf {source}: transformers' {type(model).__name__ if model is not None else 'model'} does not run on "
                         f"the profile init would write ({type(err).__name__}: {short_error(err)}); "
                         f"{parts}write its config and [[inputs]] by hand (see docs/models.md)") from err
    if not checkpoint:  # a checkpoint's export may take minutes: its build says what its export cannot do
        choose_exporter(document, path, model_name)


def choose_exporter(document: Any, path: Path, model_name: str) -> None:
    """Export the model as its build will (unchecked, into a scratch folder) and make the profile one that exports, with a
    comment: a dim the model's code fixes (funnel's seq) written static; the torchscript exporter where only it exports
    (swin, xlnet). With neither, or out of time, the profile keeps dynamo, whose line its build prints."""
    from pipeline.export import export_model, export_unchecked
    from pipeline.fixed_dims import DimFixed

    profile = Profile.model_validate({**document.unwrap(), "source": path})
    with tempfile.TemporaryDirectory() as scratch:
        try:
            with step(f"exporting {model_name} with the dynamo exporter"):
                export_unchecked(profile, Path(scratch) / "dynamo.onnx", exporter="dynamo")
            return
        except OutOfTime as out:
            document["export"].comment(f"not tried: {out.step} did not finish within init's time budget of {out.seconds:g} s")
            return
        except PipelineError as failed:
            if isinstance(failed, DimFixed) and failed.dim in document["dims"]:
                dim = document["dims"][failed.dim]
                dim["min"] = dim["opt"] = dim["max"] = failed.size
                dim.comment(f"{model_name}'s code fixes it: the dynamo exporter exports this size only (one engine per size)")
                return
            dynamo = first_line(failed).removeprefix("export: ").split("; ")[0]
        try:
            with step(f"exporting {model_name} with the torchscript exporter, the dynamo exporter having failed"):
                export_model(profile, Path(scratch) / "torchscript.onnx", exporter="torchscript")
        except (PipelineError, OutOfTime):
            return
    document["export"]["exporter"] = "torchscript"
    document["export"].comment(f"torchscript: {dynamo}")


def _longest_sequence(model: Any, profile: Profile) -> int:
    """The longest seq (<= dims.seq.max) the model runs at batch 1, bisected when seq max fails; seq max
    when even seq min fails (the error is then not the length's, and the caller's run reports it)."""
    import torch

    from pipeline.core.samples import make_inputs

    def runs(seq: int) -> bool:
        feeds = make_inputs(profile, seed=0, dims={"batch": 1, "seq": seq})
        try:
            model(**{name: torch.from_numpy(array) for name, array in feeds.items()})
        except Exception:  # noqa: BLE001 - any failure: this length is not accepted
            return False
        return True

    low, high = profile.dims["seq"].min, profile.dims["seq"].max
    if runs(high) or not runs(low):
        return high
    while high - low > 1:  # low runs, high does not
        middle = (low + high) // 2
        low, high = (middle, high) if runs(middle) else (low, middle)
    return low


# The small config's width and depth (under any config's names): never left at a default width.
SIZE_KEYS = {"hidden_size", "num_hidden_layers", "n_embd", "d_model", "n_layer", "num_layers"}


def _small_config(transformers: Any, model_type: str, default: Any, cut_lists: bool) -> tuple[Any, dict[str, Any]]:
    """The model_type's config with init's small fields, and those fields; a field its validation names is left at its default
    and the rest tried again, never the width or depth (a default width is no small model: mamba2's forward took 10 GB)."""
    try:
        small = small_config_fields(default, cut_lists)
        for _ in range(len(small)):
            try:
                return _with_layer_types(transformers, model_type, default, transformers.AutoConfig.for_model(model_type, **small), small)
            except Exception as err:  # noqa: BLE001 - the config's own validation (ValueError, TypeError, strict dataclass errors)
                named = [key for key in small if key in str(err) and key not in SIZE_KEYS]
                if not named:
                    raise
                small = {key: value for key, value in small.items() if key not in named}
        return transformers.AutoConfig.for_model(model_type, **small), small
    except Exception as err:  # noqa: BLE001 - as above; or a config that refuses global per-layer reads
        raise InputError(f"init --hf {model_type}: its config does not take init's small sizes ({type(err).__name__}: {short_error(err)}); "
                         "there is no small config for it: write its hf_config by hand, or use --full-size") from err


def _with_layer_types(transformers: Any, model_type: str, default: Any, config: Any, small: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """`config` made from `small`, its per-layer overrides following the layer types the config settled on (Gemma's
    config makes its last layer a full-attention one whatever the cut list said)."""
    if "per_layer_config" not in small:
        return config, small
    settled = per_layer_fields(default.to_dict(), small, config.num_hidden_layers, getattr(config, "layer_types", None))
    if settled == small["per_layer_config"]:
        return config, small
    small = {**small, "per_layer_config": settled}
    return transformers.AutoConfig.for_model(model_type, **small), small


def _starter_document(what: str, name: str, model: dict, hf_config: dict, dims: dict, inputs: list, kind: str):
    """The starter profile as a TOML document: every choice commented (`kind`: "decoder", "encoder-decoder" or "")."""
    document = tomlkit.document()
    document.add(tomlkit.comment(f"Starter profile for {what}."))
    document.add(tomlkit.comment("Set [dims] to the shapes you deploy (TensorRT builds for min..max, tuned for opt)."))
    document.add("name", name)
    document.add("model", _table(model, "hf: written by save_pretrained, relative to this file" if "hf" in model else ""))
    if hf_config:
        small = "; a small config written by init, not the model's default sizes (init --full-size writes those)" if len(hf_config) > 1 else ""
        document["model"].add("hf_config", _table(hf_config, "random weights from this config: set the sizes of your model" + small))
    document.add("dims", tomlkit.table(True))
    for dim, (low, opt, high) in dims.items():
        document["dims"].add(dim, _table({"min": low, "opt": opt, "max": high}))
    rows = tomlkit.aot()
    for row, comment in inputs:
        rows.append(_table(row, comment))
    document.add("inputs", rows)
    export = {"exporter": "dynamo", "opset": 20, **({"cache": "with-past"} if kind == "decoder" else EXPORT if kind == "encoder-decoder" else {})}
    comment = {"decoder": 'cache "with-past": one graph for prefill (past_seq = 0) and decode; "none": no KV cache', "encoder-decoder": EXPORT_COMMENT}
    document.add("export", _table(export, comment.get(kind, "")))
    return document


def _table(values: dict[str, Any], comment: str = ""):
    table = tomlkit.table()
    table.update(values)
    if comment:
        table.comment(comment)
    return table


# what wav2vec2's family is trained on: a waveform encoder's opt is one second, its max two, its min a tenth (SEW's
# encoder makes a frame of 20 samples in the small config, and its squeeze of the frames did not run on one)
SAMPLE_RATE = 16000


def _shortest_waveform(config: Any) -> int:
    """The fewest samples the convolutional feature encoder turns into one frame (400 for wav2vec2's 7 layers)."""
    samples = 1
    for kernel, stride in reversed(list(zip(config.conv_kernel, config.conv_stride, strict=False))):
        samples = (samples - 1) * stride + kernel
    return samples


def _starter_inputs(source: str, model_class: Any, config: Any, small: bool) -> tuple[dict, list[tuple[dict, str]], bool]:
    """dims {name: (min, opt, max)}, commented [[inputs]] rows, and whether the model is a decoder with its cache."""
    accepted = inspect.signature(model_class.forward).parameters
    if "pixel_values" in accepted:
        images = _part_with(config, "num_channels")
        channels, size = getattr(images, "num_channels", 3), getattr(images, "image_size", 224)  # a config naming neither: RGB at 224
        size = size if isinstance(size, int) else size[0]
        frames = getattr(config, "num_frames", None)
        if isinstance(frames, int):  # a video model (VideoMAE, TimeSformer, ViViT): frames before channels, as they take them
            pixels = {"name": "pixel_values", "dtype": "float32", "shape": ["batch", frames, channels, size, size]}
            return {"batch": (1, 4, 16)}, [(pixels, f"videos of {frames} frames, each channels first")], False
        pixels = {"name": "pixel_values", "dtype": "float32", "shape": ["batch", channels, size, size]}
        if "input_ids" not in accepted:
            return {"batch": (1, 4, 16)}, [(pixels, "images, channels first")], False
        dims, inputs = _text_inputs(_part_with(config, "vocab_size"), accepted, decoder=False)  # a dual encoder (CLIP, SigLIP): texts and images
        return dims, [*inputs, (pixels, "images, channels first")], False
    if "input_values" in accepted and isinstance(getattr(config, "conv_stride", None), (list, tuple)):  # a waveform encoder (wav2vec2's family)
        return {"batch": (1, 4, 16), "samples": (max(_shortest_waveform(config), SAMPLE_RATE // 10), SAMPLE_RATE, 2 * SAMPLE_RATE)}, [
            ({"name": "input_values", "dtype": "float32", "shape": ["batch", "samples"]}, f"raw audio, mono at {SAMPLE_RATE} Hz")], False
    if "input_ids" not in accepted:
        raise InputError(f"init --hf {source}: {model_class.__name__}.forward takes neither input_ids nor pixel_values; write the profile's [[inputs]] by hand")
    decoder = _returns_cache(model_class, config, small)
    dims, inputs = _text_inputs(config, accepted, decoder)
    if decoder:
        dims, inputs = _with_past_inputs(dims, inputs, model_class, config)
    return dims, inputs, decoder


def _part_with(config: Any, key: str) -> Any:
    """The config, or where it has no `key` its first part that has it (CLIP's num_channels is its vision_config's)."""
    if getattr(config, key, None) is not None:
        return config
    parts = [value for name, value in vars(config).items() if name.endswith("_config") and getattr(value, key, None) is not None]
    return parts[0] if parts else config


def _text_inputs(config: Any, accepted: Any, decoder: bool) -> tuple[dict, list[tuple[dict, str]]]:
    """dims and [[inputs]] rows of token ids (and the mask and segment ids the forward takes) within the config's vocabulary and positions."""
    positions = max_positions(config) or 512
    longest = min(positions // 2 if decoder else positions, 512)  # a decoder keeps positions for its cache
    dims = {"batch": (1, 4, 16), "seq": (1 if decoder else min(8, longest), min(16 if decoder else 128, longest), longest)}
    inputs = [({"name": "input_ids", "dtype": "int64", "shape": ["batch", "seq"], "range": [0, config.vocab_size]}, "token ids inside the vocabulary")]
    if "attention_mask" in accepted:
        inputs.append(({"name": "attention_mask", "dtype": "int64", "shape": ["batch", "seq"], "fill": "mask"}, "1 for tokens, 0 for padding at the end"))
    if "token_type_ids" in accepted and (getattr(config, "type_vocab_size", 0) or 0) > 1:
        inputs.append(({"name": "token_type_ids", "dtype": "int64", "shape": ["batch", "seq"], "range": [0, config.type_vocab_size]}, "segment ids"))
    return dims, inputs


# A small config's model with at most this many parameters is tried on the CPU, not the meta device.
CPU_TRY_PARAMETERS = 50_000_000


def _returns_cache(model_class: Any, config: Any, small: bool) -> bool:
    """The model returns a KV cache (pipeline/models/decoder.py), tried on the meta device (no memory,
    any size), or for a small config on the CPU: a forward meta tensors cannot run (a MoE's routing)
    would read as no cache."""
    import torch

    if "past_key_values" not in inspect.signature(model_class.forward).parameters:
        return False
    with torch.device("meta"):
        model = model_class(config)
    parameters = sum(p.numel() for p in model.parameters())
    with step(f"running {model_class.__name__} once to see whether it returns a KV cache"):
        if small and parameters <= CPU_TRY_PARAMETERS:
            return returns_cache(model_class(config))
        if returns_cache(model):
            return True
        # no cache on meta may be a forward meta cannot run (a MoE's routing): a small config that fits memory runs on the
        # CPU (axk1's, 77M parameters; else init wrote an encoder's dims for it and refused them)
        return small and export_peak_bytes(parameters * 4, ExportSection().exporter) <= available_bytes() and returns_cache(model_class(config))


def _with_past_inputs(dims: dict, inputs: list, model_class: Any, config: Any) -> tuple[dict, list]:
    """A decoder's starter dims and inputs with its KV cache, read from the model built on the meta device."""
    import torch

    comments = {"input_ids": "new token ids", "attention_mask": "1 per past and new token, 0 for padding",
                "position_ids": "positions of the new tokens", "past_key_values": "the KV cache: [batch, kv_heads, past_seq, head_dim]"}
    base = Profile.model_validate({"name": "starter", "model": {"hf_config": {"model_type": config.model_type}},
                                   "dims": {d: {"min": lo, "opt": op, "max": hi} for d, (lo, op, hi) in dims.items()},
                                   "inputs": [row for row, _ in inputs]})
    with torch.device("meta"):
        derived = with_past_profile(base, model_class(config))
    rows = []
    for spec in derived.inputs:
        row = {"name": spec.name, "dtype": spec.dtype, "shape": list(spec.shape)}
        if spec.range:
            row["range"] = [int(spec.range[0]), int(spec.range[1])]
        elif spec.fill != "random":
            row["fill"] = spec.fill
        rows.append((row, comments.get(spec.name.split(".")[0], "")))
    return {d: (r.min, r.opt, r.max) for d, r in derived.dims.items()}, rows
