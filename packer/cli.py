"""The ``packer`` command line. Parses flags, builds a config, calls one library function.

Build flags are generated from :class:`packer.config.BuildConfig`, so every pipeline
key has a flag of the same name and none can be forgotten.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from packer import __version__
from packer.config.fields import FIELDS, GROUPS, REPACK_KEYS
from packer.config.pipeline import DEFAULT_PIPELINE
from packer.errors import PackerError

FLAG_NAMES = {"input": "--input", "output": "--output"}


class ConfigCommand(click.Command):
    """A command whose ``--help`` lists its config flags in one section per field group."""

    def format_options(self, ctx, formatter):
        sections: dict[str, list] = {group: [] for group in (*GROUPS, "other")}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            if record is not None:
                f = FIELDS.get(param.name)
                sections[f.metadata["group"] if f else "other"].append(record)
        for group, records in sections.items():
            if records:
                with formatter.section(f"{group.capitalize()} options"):
                    formatter.write_dl(records)


def _config_options(names, *, kept: tuple[str, ...] = ()):
    """Flags for the config fields ``names``; those of the stages in ``kept`` show no default (repack: SOURCE's)."""
    return lambda fn: _add_options(fn, [FIELDS[n] for n in names], kept)


def _default_text(f, kept: tuple[str, ...] = ()) -> str:
    """The default of a field, as ``--help`` shows it (packer's own: a pipeline file may override it)."""
    if f.metadata["stage"] in kept or (kept and f.name == "output"):
        return ""
    value = f.default
    if isinstance(value, bool):
        return f" [default: {'' if value else 'no-'}{f.name.replace('_', '-')}]"
    if isinstance(value, tuple):
        value = ", ".join(map(str, value))
    return "" if value in ("", None) else f" [default: {value}]"


def _add_options(fn, fields, kept: tuple[str, ...] = ()):
    for f in reversed(fields):
        flag = FLAG_NAMES.get(f.name, "--" + f.name.replace("_", "-"))
        names = [flag] + ([f.metadata["short"]] if f.metadata.get("short") else [])
        help_text = f.metadata["help"] + _default_text(f, kept)
        if isinstance(f.default, bool):
            flag = f"{flag}/--no-{f.name.replace('_', '-')}"
            names = [flag]
            fn = click.option(*names, f.name, default=None, help=help_text)(fn)
        elif f.type == "tuple[int, ...]":
            fn = click.option(*names, f.name, multiple=True, default=None, help=help_text, callback=_int_list,
                              metavar="N[,N...]")(fn)
        elif isinstance(f.default, tuple):
            fn = click.option(*names, f.name, multiple=True, default=None, help=help_text, callback=_str_list)(fn)
        else:
            if f.metadata.get("choices"):
                kind = click.Choice(f.metadata["choices"])
            elif isinstance(f.default, float):
                kind = float
            else:
                kind = int if isinstance(f.default, int) else str
            fn = click.option(*names, f.name, type=kind, default=None, help=help_text)(fn)
    return fn


def _int_list(ctx, param, values: tuple[str, ...]) -> tuple[int, ...] | None:
    """``--report-ranks 8,64`` or the flag given twice: one tuple of integers; None when not
    given, so the pipeline's value or the default stands."""
    try:
        return tuple(int(v) for value in values for v in value.split(",")) or None
    except ValueError:
        raise click.BadParameter(f"{', '.join(values)!r}: write integers separated by commas, e.g. 8,64") from None


def _str_list(ctx, param, values: tuple[str, ...]) -> tuple[str, ...] | None:
    """The flag given once or more (``--modalities`` a name or several separated by commas: ``image,video`` is
    ``--modalities image --modalities video``): the values in order, an empty one adding nothing, so
    ``--modalities ''`` is the empty list (text only), as ``modalities = []`` is in a pipeline file; None when not
    given, so the pipeline's value or the default stands."""
    if not values:
        return None
    if param.name != "modalities":  # an input's options are separated by commas: never split
        return tuple(v for v in values if v != "")
    return tuple(v.strip() for value in values for v in value.split(",") if v.strip())


def _run(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except PackerError as e:
        click.echo(f"packer: error: {e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (packer.engine.Interrupted): workers are already gone
        click.echo("\npacker: interrupted; finished shards are kept: run the same command again to resume", err=True)
        sys.exit(getattr(e, "exit_code", 130))
    except OSError as e:  # outside any record: a full disk, a read-only or missing folder, a file where a folder goes
        where = f"{e.filename}: " if e.filename else ""
        click.echo(f"packer: error: {where}{e.strerror or e}", err=True)
        sys.exit(1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="packer")
def main():
    """packer: tokenize, count media positions and bin-pack training data into Arrow shards."""


@main.command(cls=ConfigCommand)
@click.argument("pipeline", required=False, type=click.Path(dir_okay=False))
@_config_options(FIELDS)
def build(pipeline, **options):
    """Build packed shards. PIPELINE defaults to pipelines/sample.toml; flags override its keys.

    Give --tokenizer (your model's: a hub name or a folder): the pipelines' own is sample_data's toy tokenizer."""
    from packer.config.pipeline import resolve
    from packer.pipeline.build import build as run_build
    from packer.summary import summarize, summary_text

    if pipeline is None and DEFAULT_PIPELINE.is_file():
        pipeline = DEFAULT_PIPELINE
    elif pipeline is None and not options.get("input"):
        click.echo(f"packer: error: no pipeline and no input: {DEFAULT_PIPELINE} is not here ({Path.cwd()}). `packer build` "
                   f"alone runs the repository's sample job. To build your data, run\n"
                   f"    packer build -i data.jsonl -o out/data --tokenizer Qwen/Qwen2.5-0.5B-Instruct\n"
                   f"(any tokenizer folder or hub name), or give a pipeline file: packer build job.toml (its keys are the "
                   f"flags of packer build --help). To see the sample job, run `make demo` in the packer repository.",
                   err=True)
        sys.exit(2)
    if pipeline is not None and (options.get("input") or options.get("output")) and options.get("name") is None:
        options["name"] = ""  # another job than the pipeline's: its title comes from the output folder
    config = _run(resolve, pipeline, **options)
    manifest = _run(run_build, config)
    click.echo(summary_text(summarize(manifest.execution["output"])))


@main.command()
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--row", "row", type=int, default=None, help="List this packed row's segments instead.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (for scripts).")
def inspect(out, row, as_json):
    """Summarise a build (rows, tokens, fill, lower bound, quarantine by reason), or one row."""
    import json

    from packer.loader.row_detail import row_detail, row_text
    from packer.summary import summarize, summary_text

    if row is not None:
        d = _run(row_detail, out, row)
        click.echo(json.dumps(d, indent=2, sort_keys=True) if as_json else row_text(d))
    else:
        s = _run(summarize, out)
        click.echo(json.dumps(s, indent=2, sort_keys=True) if as_json else summary_text(s))


@main.command(cls=ConfigCommand)
@click.argument("source", type=click.Path(file_okay=False, exists=True))
@_config_options(REPACK_KEYS, kept=("plan",))
def repack(source, **options):
    """Re-plan the build in SOURCE (another max length, algorithm, caps, seed, ...) into -o
    OUT2, reusing its encoded samples: nothing is re-tokenized or re-read. Packing options
    and shard sizes not given keep SOURCE's values. An OUT2 that holds an earlier repack of
    SOURCE is replaced; any other build there needs --overwrite."""
    from packer.pipeline.repack import repack as run_repack
    from packer.summary import summarize, summary_text

    manifest = _run(run_repack, source, **options)
    click.echo(summary_text(summarize(manifest.execution["output"])))


@main.command(cls=ConfigCommand)
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--html", help="Where to write the HTML report (default: OUT/report.html).")
@_config_options(("report_ranks", "report_batch", "report_window"), kept=("execution",))
def report(out, html, **settings):
    """Recompute OUT/report.json and the HTML report from the build's shards. Report settings not
    given keep the build's; those given are recorded in its manifest."""
    from packer.report import refresh_report

    settings = {k: (v or None) if isinstance(v, tuple) else v for k, v in settings.items()}
    r = _run(refresh_report, out, html_path=html, **settings)
    b = r["batching"]
    click.echo(f"{out}/report.json, {html or out + '/report.html'}: fill {100 * r['fill']:.2f}%, rows {r['rows']:,} "
               f"(L1 {r['lower_bound']:,}), {b['speedup_vs_padded_random']:.2f}x fewer tokens computed than padding")


@main.command()
@click.argument("out", type=click.Path(file_okay=False, exists=True))
@click.option("--ranks", type=click.IntRange(min=1), required=True, help="Data-parallel ranks the plan is for.")
@click.option("--batch-size", type=click.IntRange(min=1), default=1, show_default=True, help="Rows per rank a step.")
@click.option("--accumulation", type=click.IntRange(min=1), default=1, show_default=True,
              help="Micro-steps a rank accumulates before the ranks sync (DDP under no_sync): its rows of an optimizer "
                   "step are balanced together. Leave 1 under FSDP / ZeRO-3 (they sync every micro-step).")
@click.option("--epochs", type=click.IntRange(min=1), default=1, show_default=True, help="Epochs to plan.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="The plan's seed (the sampler's; >= 0).")
@click.option("--window", type=click.IntRange(min=1), default=None,
              help="Steps per grouping window (default: the whole epoch; smaller: rows meet more varied rows).")
@click.option("--cost-model", "cost_model", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A cost model JSON (packer calibrate) instead of the build's.")
@click.option("--stages", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A TOML file of mixture stages ([[stages]] start, end, weights = {source = w}) to plan instead of "
                   "epochs.")
@click.option("-o", "--output", default=None, help="Where to write the plan (default: OUT/steps/ranksR-batchB-seedS.arrow).")
def steps(out, ranks, batch_size, accumulation, epochs, seed, window, cost_model, stages, output):
    """Plan which rows each of RANKS data-parallel ranks trains at every step, balanced on the rows' llm, encoder
    and supervised cost at once, and write the plan StepPlanSampler(plan=...) follows."""
    from packer.loader.samplers.step_plan import plan_command, summary_text

    click.echo(summary_text(_run(plan_command, out, ranks=ranks, batch_size=batch_size, epochs=epochs, seed=seed,
                                 window=window, cost_model=cost_model, stages=stages, output=output,
                                 accumulation=accumulation)))


@main.command()
@click.argument("model")
@click.option("--device", default="cpu", show_default=True, help="Where to time the model: cpu, cuda, cuda:1, ...")
@click.option("--dtype", default="auto", show_default=True,
              help="Parameter dtype: float32, bfloat16, float16; auto: bfloat16 on cuda, float32 on cpu.")
@click.option("--attention", default="sdpa", show_default=True,
              help="The model's attn_implementation (sdpa, eager, flash_attention_2, ...): the kernel training uses.")
@click.option("--max-tokens", type=click.IntRange(min=32), default=4096, show_default=True,
              help="Longest text row timed (rows of a quarter, a half and all of it, in 1, 4 and 16 segments).")
@click.option("--max-image-tokens", type=click.IntRange(min=16), default=1024, show_default=True,
              help="Placeholder tokens of the largest image timed (a model with a Qwen-style vision tower).")
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed runs per shape (the median is fitted).")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Untimed runs per shape first.")
@click.option("--threads", type=click.IntRange(min=0), default=0, show_default=True,
              help="CPU threads torch uses (0: its default); 1 on a CPU other jobs share.")
@click.option("-o", "--output", default="cost_model.json", show_default=True, help="Where to write the JSON.")
def calibrate(model, device, dtype, attention, max_tokens, max_image_tokens, repeats, warmup, threads, output):
    """Fit the cost model to MODEL's measured forward + backward time (a folder holding config.json, or a hub id;
    random weights from its config): text rows of several lengths and segmentations, images of several sizes. Writes
    the coefficients that `packer build --cost-model` and `packer steps --cost-model` read."""
    from packer.cost.calibrate import calibrate_command, summary_text

    click.echo(summary_text(_run(calibrate_command, model, output, device=device, dtype=dtype, attention=attention,
                                 max_tokens=max_tokens, max_image_tokens=max_image_tokens, repeats=repeats,
                                 warmup=warmup, threads=threads)))


@main.command()
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--media", type=click.Choice(["stat", "hash"]), is_flag=False, flag_value="stat", default=None,
              help="Also check every media file against the build's media index: size and modification time (stat, "
                   "the default of --media), or content (hash: sha256; needs a build made with --media-hash).")
@click.option("--against-processor", "processor", metavar="PROC",
              help="Also re-run this HF processor (a folder or hub id) on sampled records, from their own lines and "
                   "files, and compare its ids with the build's token for token.")
@click.option("--sample", type=click.IntRange(min=1), default=32, show_default=True,
              help="How many records --against-processor re-runs (media records first).")
@click.option("--media-root", default=None, help="Where the media are now, when they moved since the build (--media, "
                                                 "--against-processor; default: the build's).")
@click.option("--collate", is_flag=True, help="Also prove every row can be collated for the build's family from its "
                                              "stored spans, no pixel loaded (rows of one video frame count, ...).")
@click.option("--deep", is_flag=True, help="Also re-derive the plan from the samples' lengths and the manifest's plan "
                                           "settings (stage 2 again), every packed row from samples/ and plan.arrow "
                                           "(stage 3 again) and the tokenizer record from tokenizer/, no media, and "
                                           "compare: catches a consistent edit of a shard whose hash was updated in the "
                                           "manifest, or of the manifest's max_length, seed or tokenizer hash; prints "
                                           "what it cannot check (the code version, ...).")
def verify(out, media, processor, sample, media_root, collate, deep):
    """Check every file of the build folder against the manifest (nothing missing, changed or extra),
    every row's invariants and the accounting; with --media, every media file too. A damaged shard is
    named on one line (exit 6), never a crash."""
    from packer.verify import verify_or_raise

    click.echo(_run(verify_or_raise, out, media=media, media_root=media_root, collate=collate, deep=deep))
    if processor:
        from packer.verify.against_processor import verify_against_processor_or_raise

        click.echo(_run(verify_against_processor_or_raise, out, processor, sample=sample, media_root=media_root))


if __name__ == "__main__":
    main()
