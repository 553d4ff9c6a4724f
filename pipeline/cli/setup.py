"""Commands that set a project up: list the packaged profiles, write a starter profile for a Hugging Face model."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional, get_args

import typer

from pipeline.cli.app import app, choices, stdout_console
from pipeline.core.errors import PipelineError
from pipeline.core.profiles import HfTask as ProfileTask
from pipeline.models.trial import DEFAULT_SECONDS, SECONDS_ENV


@app.command(
    help=(
        "List the packaged profiles (and those in ./profiles): name, model, inputs, description. Use one with "
        "--profile NAME.\n\n"
        "Examples:\n\n"
        "  python -m pipeline profiles"
    )
)
def profiles() -> None:
    from pipeline.core.profiles import describe_profiles

    rows = describe_profiles()
    width = max(len(r["name"]) for r in rows)
    lines = [f"{r['name']:<{width}}  {r['model']}  inputs: {r['inputs']}" + (f"\n{'':<{width}}  {r['description']}" if r["description"] else "") for r in rows]
    sys.stdout.write("\n".join(lines) + "\n")


HfTask = choices("HfTask", get_args(ProfileTask))  # the profile's tasks


@app.command(
    help=(
        "Write a starter profile for a Hugging Face model: SOURCE is a folder written by save_pretrained, or a "
        "model_type (random weights from a small config; --full-size for its default sizes). Inputs come from the model's forward "
        "(input_ids, attention_mask, token_type_ids; or pixel_values; a decoder's KV cache), dims from the config; edit them to your shapes.\n\n"
        "Examples:\n\n"
        "  python -m pipeline init --hf ./my-checkpoint --task sequence-classification -o my-model.toml\n\n"
        "  python -m pipeline init --hf bert -o bert.toml"
    )
)
def init(
    hf: Annotated[str, typer.Option("--hf", help="save_pretrained folder, or a model_type such as bert, gpt2, vit.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Profile file to write (never overwritten).")],
    task: Annotated[Optional[HfTask], typer.Option(help="The head to load [default: base; an encoder-decoder's generation model: "
                                                        "seq2seq-lm, or speech2seq-lm for Whisper].")] = None,
    full_size: Annotated[bool, typer.Option("--full-size", help="With a model_type: its default config's sizes (e.g. 7B parameters), not a small config.")] = False,
    budget: Annotated[float, typer.Option("--budget", min=0.001, envvar=SECONDS_ENV,
                                          help="Seconds init may spend building and running the model; past them it refuses, naming the step.")] = DEFAULT_SECONDS,
) -> None:
    if output.exists():
        raise PipelineError(f"{output} exists; choose another -o or remove it")
    from pipeline.core.fileio import write_text
    from pipeline.core.profiles import load_profile
    from pipeline.models.starter import starter_profile

    name = output.stem if output.suffix == ".toml" else output.name
    text = starter_profile(hf, task.value if task else None, name, output.resolve().parent, full_size, budget)
    write_text(output, text)
    load_profile(str(output))  # what was written is a valid profile
    stdout_console().print(f"wrote {output}; set its [dims] to your shapes, then: python -m pipeline build --profile {output} --fp16 --int8",
                           highlight=False, markup=False)
