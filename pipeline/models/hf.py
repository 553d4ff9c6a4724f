"""Hugging Face models from a profile's `[model] hf` (a model id or save_pretrained folder) or `hf_config` (random weights,
nothing downloaded), with the `task` head; the profile's inputs go to the forward by name. transformers is the optional
extra `.[hf]`, imported at call time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.core.errors import ProfileError, first_line
from pipeline.core.modelsource import local_folder
from pipeline.core.profiles import Profile
from pipeline.models.size import INIT_STD, check_fits

AUTO_CLASSES = {
    "base": "AutoModel",
    "sequence-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "masked-lm": "AutoModelForMaskedLM",
    "causal-lm": "AutoModelForCausalLM",
    "image-classification": "AutoModelForImageClassification",
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
    "speech2seq-lm": "AutoModelForSpeechSeq2Seq",
}


def load_hf_model(profile: Profile) -> Any:
    """The profile's Hugging Face model as transformers builds it (hf / hf_config, task)."""
    transformers = import_transformers(f"{profile.source}: model.hf/hf_config")
    section, where = profile.model, f"{profile.source}: model"
    task = section.task or "base"
    auto = getattr(transformers, AUTO_CLASSES[task])
    if section.hf_config is not None:
        fields = dict(section.hf_config)
        model_type = fields.pop("model_type")
        try:
            config = transformers.AutoConfig.for_model(model_type, **fields)
        except (ValueError, TypeError) as err:
            raise ProfileError(f"{where}.hf_config: {short_error(err)}") from err
        _name_first_architecture(auto, config)
        try:
            check_fits(auto, config, f"{where}.hf_config ({model_type})", profile.export.exporter)
            model = auto.from_config(config)
            std = getattr(config, "initializer_range", None) or INIT_STD
            draw_zero_tokens(model, std)
            draw_zero_routers(model, config, std)
            settle_batch_norm(model, profile)
        except ValueError as err:
            raise ProfileError(f"{where}.task: transformers has no {task} model for model_type {model_type!r}; choose another task") from err
        except (IndexError, KeyError, TypeError, AttributeError, AssertionError) as err:  # fields the config accepted but the model cannot use together
            raise ProfileError(f"{where}.hf_config: transformers cannot build a {model_type} model from these fields "
                               f"({type(err).__name__}: {short_error(err)}); make the fields agree (e.g. one depth per "
                               f"stage, num_stages = len(depths)), see {type(config).__name__} in transformers' documentation") from err
    else:
        location = local_folder(profile)
        if location is not None:  # a model id's config is only known once downloaded
            _check_folder_fits(transformers, auto, location, f"{where}.hf ({section.hf})", profile.export.exporter)
        try:
            model, loading = auto.from_pretrained(str(location) if location else section.hf, output_loading_info=True)
        except (OSError, ValueError) as err:
            raise ProfileError(
                f"{where}.hf: cannot load {section.hf!r} as {AUTO_CLASSES[task]}: {short_error(err)}; "
                "give a folder written by save_pretrained (relative to the profile) or a model id this machine can download"
            ) from err
        fresh = sorted({*loading["missing_keys"], *(str(k) for k in loading["mismatched_keys"])})
        if fresh:  # transformers would initialize them at random: never deploy that silently
            raise ProfileError(f"{where}.task: {len(fresh)} weights of the {task} model are not in {section.hf!r} (e.g. {fresh[0]}) and would be random; "
                               "choose the task the checkpoint was saved for (base loads any checkpoint's encoder)")
    return _exportable_experts(model).eval()


def _exportable_experts(model: Any) -> Any:
    """A mixture of experts run as transformers' `batched_mm` (every token through every expert, then weighted) instead of
    `grouped_mm`, a custom op with no ONNX translation: the same outputs, at the price of a static graph (docs/decoders.md)."""
    implementations = model.get_experts_implementation() if hasattr(model, "get_experts_implementation") else {}
    if "grouped_mm" in (implementations.values() if isinstance(implementations, dict) else (implementations,)):
        model.set_experts_implementation("batched_mm")
    return model


def _name_first_architecture(auto: Any, config: Any) -> None:
    """Where the task maps the config to several classes (funnel: FunnelModel, FunnelBaseModel), transformers'
    from_config picks the one config.architectures names and fails without a name ("'NoneType' object is not
    iterable"): name the first, the class init reads the inputs of (pipeline/models/starter.py)."""
    try:
        classes = auto._model_mapping[type(config)]
    except KeyError:
        return  # no model for this task: from_config says so
    if isinstance(classes, tuple) and not config.architectures:
        config.architectures = [classes[0].__name__]


def draw_zero_tokens(model: Any, std: float) -> list[str]:
    """Draw (normal, `std`, as ViT's init does) the all-zero token and embedding parameters a module holds itself (LeViT's
    zero attention biases stay); the names drawn. YOLOS left 101 tokens at zero, identical, which LayerNorm scales up from
    the attention's last bits: its INT8 check read cosine 0.81."""
    import torch

    plain = (torch.nn.Linear, torch.nn.modules.conv._ConvNd, torch.nn.Embedding, torch.nn.LayerNorm, torch.nn.modules.batchnorm._NormBase,
             torch.nn.GroupNorm)
    drawn = []
    with torch.no_grad():
        for module_name, module in model.named_modules():
            if isinstance(module, plain):
                continue
            for name, parameter in module.named_parameters(recurse=False):
                if parameter.dim() >= 2 and ("token" in name or "embedding" in name) and not parameter.any():
                    parameter.normal_(0.0, std)
                    drawn.append(f"{module_name}.{name}".lstrip("."))
    return drawn


EXPERT_COUNTS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")


def draw_zero_routers(model: Any, config: Any, std: float) -> list[str]:
    """Draw (normal, `std`) the all-zero router weights (one output per expert) an init leaves (AFMoE's); the names drawn.
    Tied experts are picked in the order each TopK breaks ties, which differ: AFMoE's export check read 1.07 off torch."""
    import torch

    experts = {count for key in EXPERT_COUNTS if isinstance(count := getattr(config, key, None), int) and count > 1}
    drawn = []
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and module.out_features in experts and not module.weight.any():
                module.weight.normal_(0.0, std)
                drawn.append(name)
    return drawn


BATCH_NORM_BATCHES = 4


def settle_batch_norm(model: Any, profile: Profile) -> int:
    """Give a random-weight model's BatchNorm layers the scale of its own activations (second moment about zero, over
    BATCH_NORM_BATCHES runs at opt shapes) and torch's affine init; the number of layers settled. Left at variance 1, a
    MobileNetV2's outputs came out near 1e-21 (FP16 cosine 0); an init drawing the scale N(0, 0.02) shrinks it 50x a layer.
    Mean and variance would make a random ReLU net chaotic (1.47x a layer): a MobileNetV1 read INT8 cosine 0.71, not 0.992."""
    import torch

    from pipeline.core.samples import make_inputs

    layers = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not layers:
        return 0
    for layer in layers:
        layer.reset_parameters()  # the running statistics, and the scale and shift where the layer has them
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
        layer.running_var += layer.running_mean.square()
        layer.running_mean.zero_()
        layer.eval()
    return len(layers)


def _check_folder_fits(transformers: Any, auto: Any, folder: Path, where: str, exporter: str) -> None:
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder))
        check_fits(auto, config, where, exporter)
    except (OSError, ValueError):
        return  # from_pretrained says what is wrong with the folder


def _transformers_requirement() -> str:
    """The [hf] extra's transformers pin as installed (so the hint works from any folder), else plain transformers."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        pins = [r.split(";")[0].strip() for r in requires("trt-pipeline") or [] if r.startswith("transformers")]
    except PackageNotFoundError:
        pins = []
    return pins[0] if pins else "transformers"


def import_transformers(needed_by: str, error: type[Exception] = ProfileError):
    try:
        import transformers
    except ImportError as err:
        raise error(_needs_transformers(needed_by)) from err
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # "Loading weights" bars: the stage's own line and progress say it
    return transformers


def _needs_transformers(needed_by: str) -> str:
    return f'{needed_by} needs transformers: pip install "{_transformers_requirement()}" (the [hf] extra)'


def transformers_missing(needed_by: str) -> str | None:
    """What import_transformers would say where transformers is not installed, found without importing it (seconds); None where it is."""
    import importlib.util

    return None if importlib.util.find_spec("transformers") is not None else _needs_transformers(needed_by)


def short_error(err: Exception) -> str:
    """The error's first line, without transformers' list of every known model type."""
    return first_line(err).split(". Should contain one of")[0]
