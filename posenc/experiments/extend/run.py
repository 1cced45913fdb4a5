"""One `posenc extend` run from a validated config: load the model, plan and print the cost, run
perplexity and/or passkey (resumable), write the results."""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from posenc.errors import bad_value
from posenc.experiments.config import loader as config_loader
from posenc.experiments.config.sections import run_device
from posenc.experiments.extend.config import OLD_CONFIG_FILE, RULE, ExtendConfig
from posenc.experiments.extend.forward_work import forward_work
from posenc.experiments.extend.long_context import bfloat16_linears, estimated_cpu_seconds, inference
from posenc.experiments.extend.model import load_model, model_name
from posenc.experiments.extend.passkey import planned_passkey_tokens, planned_prompts, run_passkey
from posenc.experiments.extend.passkey_prompts import PromptBuilder
from posenc.experiments.extend.perplexity import planned_forwards, planned_tokens, run_perplexity, token_windows
from posenc.experiments.extend.progress import STATE_FILE, RunState
from posenc.experiments.extend.report import longest_forward, run_meta, write_results
from posenc.experiments.extend.ruler_sweep import planned_ruler_prompts, run_ruler
from posenc.experiments.extend.tuning import check_points_act, planned_tuning_prompts, run_tuning, tune_length
from posenc.experiments.runs import manifest
from posenc.experiments.runs.lifecycle import run_folder
from posenc.experiments.runs.rule import Run
from posenc.experiments.sequence_start import check_same_start, sequence_start, start_record
from posenc.models.llama import Llama


def _check_passkey_lengths(cfg: ExtendConfig, builder: PromptBuilder) -> None:
    short = [n for n in cfg.key_lengths if n < builder.min_length()]
    if short:
        raise bad_value("passkey_lengths", tuple(short), f"lengths >= {builder.min_length()} (instructions, "
                        "needle and question alone take that many tokens of this tokenizer)")


def _check_ruler_lengths(cfg: ExtendConfig, builder: Any) -> None:
    for task in cfg.ruler.task_names:
        short = [n for n in cfg.ruler_lengths if n < builder.min_length(task)]
        if short:
            raise bad_value("ruler.lengths", tuple(short), f"lengths >= {builder.min_length(task)} for {task} (its "
                                                          "instructions, needles and question alone take that many "
                                                          "tokens of this tokenizer)")


def _check_tune_length(cfg: ExtendConfig, builder: PromptBuilder, ruler_builder: Any) -> None:
    if not cfg.tune.grid:
        return
    length = tune_length(cfg)
    least = max([builder.min_length() if cfg.tune.passkeys else 0,
                 *(ruler_builder.min_length(task) for task in cfg.tune.ruler_tasks)])
    if length < least:
        raise bad_value("tune.length", length, f"at least {least} tokens (the tuning prompts' instructions, needles "
                                               "and questions alone take that many tokens of this tokenizer)")


def estimate_minutes(cfg: ExtendConfig, model: Llama) -> float:
    """Rough wall minutes on 2 idle cores for the planned forwards of this model (bfloat16; float32 takes roughly
    2-3x): a perplexity forward scores every position, a retrieval prompt its last and then decodes."""
    work, chunk = forward_work(model.cfg), cfg.model.prefill_chunk
    seconds = sum(estimated_cpu_seconds(work, n, chunk, mapped, scored=n) for n, mapped in planned_forwards(model, cfg))
    seconds += sum(estimated_cpu_seconds(work, n, chunk, mapped) for n, mapped in planned_prompts(cfg, model))
    seconds += sum(estimated_cpu_seconds(work, n, chunk, mapped, decoded)
                   for n, mapped, decoded in [*planned_ruler_prompts(cfg, model), *planned_tuning_prompts(cfg)])
    return seconds / 2 / 60


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def stored_extend_run(run_dir: Path) -> dict[str, Any] | None:
    """run.json; for a folder from before extend wrote one, a record built from its config.json and
    the wall time its progress.json kept."""
    found = manifest.read(run_dir)
    old = run_dir / OLD_CONFIG_FILE
    if found is not None or not old.is_file():
        return _today(found)
    try:
        config = json.loads(old.read_text(encoding="utf-8"))
        progress = run_dir / STATE_FILE
        wall = json.loads(progress.read_text(encoding="utf-8")).get("wall_s") if progress.is_file() else None
    except (OSError, ValueError, AttributeError) as err:
        raise bad_value("run_dir", str(run_dir), f"an extend run folder with readable {old.name} ({err})") from None
    return _today({"command": RULE.command, "config": config, "corpus": None, "wall_seconds": wall})


def _today(stored: dict[str, Any] | None) -> dict[str, Any] | None:
    """Its config read through today's schema: flat keys of older runs sectioned, keys added since at
    their defaults, so it compares with a config made now."""
    if stored is None or stored.get("command") != RULE.command:
        return stored
    return stored | {"config": config_loader.build(ExtendConfig, stored["config"]).to_dict()}


def run(cfg: ExtendConfig, run_dir: Path | None) -> int:
    """A new run (run_dir None: a new folder under out_dir) or the unfinished run in run_dir, continued."""
    from posenc.data.corpus import load_builtin

    run_device(cfg.model.device, "model.device")  # a GPU this machine lacks: one line now, before a folder is made
    corpus = load_builtin(cfg.perplexity.corpus)
    # Preflight before a model loads or a folder is made: a token is at least one character, so a length past
    # the text's characters can never be windowed (the exact token count needs the model's tokenizer).
    if cfg.ppl_lengths and max(cfg.ppl_lengths) >= len(corpus.text):
        raise bad_value("perplexity.lengths", max(cfg.ppl_lengths), f"lengths below the {len(corpus.text):,} "
                                                                    "characters of perplexity.corpus (a token "
                                                                    "holds at least one)")
    record = {"name": cfg.perplexity.corpus, "sha256": corpus.sha256}
    sweeping: dict[str, RunState] = {}  # the sweep's progress once it measures: what a stop writes the tables of
    stopped = lambda opened: _write_stopped(sweeping.get("state"), cfg, corpus, opened)
    with run_folder(run_dir, cfg.out_dir, RULE, cfg.to_dict(), record, on_stop=stopped,
                    read=stored_extend_run) as opened:
        return _sweep(cfg, opened, corpus, sweeping)


def _sweep(cfg: ExtendConfig, opened: Run, corpus: Any, sweeping: dict[str, RunState]) -> int:
    from tqdm import tqdm

    run_dir = opened.path
    device = run_device(cfg.model.device, "model.device")
    model = load_model(cfg).to(device)
    if cfg.model.dtype == "bfloat16":
        bfloat16_linears(model)
    encode = lambda text: model.tokenizer.encode(text, add_special_tokens=False)
    start = sequence_start(model.tokenizer)  # [BOS] where the checkpoint's tokenizer adds one: every sequence's start
    builder = PromptBuilder(encode, start)
    _check_passkey_lengths(cfg, builder)
    ruler_builder = None
    if cfg.ruler_lengths:
        from posenc.experiments.extend.ruler import RulerBuilder

        ruler_builder = RulerBuilder(encode, cfg.ruler.model_template, start)
        _check_ruler_lengths(cfg, ruler_builder)
    windows = (token_windows(encode, corpus.text, max(cfg.ppl_lengths), cfg.perplexity.windows, start)
               if cfg.ppl_lengths else None)
    check_same_start(opened, start)  # a run from before BOSes were added had none
    opened.note(sequence_start=start_record(start))
    state = RunState.load(run_dir, on_save=lambda: opened.tick(force=True))
    extended = [i for i in range(model.cfg.n_layer) if model.cfg.extends_layer(i)]
    state.machine = {"model": model_name(cfg, model), "context_length": model.cfg.max_seq_len,
                     "extension_layers": model.cfg.extension_layers, "extended_layers": extended,
                     "device": device_name(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
                     "cpu": platform.processor(),  # the last session's, where a resumed run moved
                     "sequence_start": start_record(start)}
    done = (f"; done before: {len(state.ppl)} perplexity rows, {len(state.passkey)} passkey and {len(state.ruler)} "
            "RULER prompts" if state.forwards else "")
    where = (f"about {estimate_minutes(cfg, model):.0f} min on 2 idle cores" if device.type == "cpu"
             else f"on {device_name(device)} (the time estimate is for CPUs only)")
    print(f"run folder: {run_dir}\nplan: {where} for the whole run ({cfg.model.dtype}, prefill chunk "
          f"{cfg.model.prefill_chunk}){done}; progress is saved after every step")
    if cfg.tune.grid and cfg.tune.ruler_tasks and ruler_builder is None:
        from posenc.experiments.extend.ruler import RulerBuilder

        tune_ruler = RulerBuilder(encode, cfg.ruler.model_template, start)
    else:
        tune_ruler = ruler_builder
    _check_tune_length(cfg, builder, tune_ruler)
    check_points_act(cfg, model)
    ruler_tokens = sum(n for n, _, _ in planned_ruler_prompts(cfg, model))
    total = planned_tokens(model, cfg) + planned_passkey_tokens(cfg, model) + ruler_tokens
    total += sum(n for n, _, _ in planned_tuning_prompts(cfg))
    sweeping["state"] = state  # from here a stop (Ctrl-C or SIGTERM) writes the tables of what finished
    with inference(cfg.model.dtype, device), tqdm(total=total, unit="tok", dynamic_ncols=True) as bar:
        tuned = run_tuning(cfg, model, builder, tune_ruler, state, bar)  # cfg itself without tune.grid
        if windows is not None:
            run_perplexity(tuned, model, windows, state, bar)
        if cfg.key_lengths:
            run_passkey(tuned, model, builder, state, bar)
        if ruler_builder is not None:
            run_ruler(tuned, model, ruler_builder, state, bar)
    meta = _write(state, cfg, corpus, opened, complete=True)
    print(f"run folder: {run_dir}  ({meta['wall_s']:.0f} s)")
    return 0


def _write_stopped(state: RunState | None, cfg: ExtendConfig, corpus: Any, opened: Run) -> None:
    """The lifecycle's report on interruption: the tables of the cells that finished, marked incomplete;
    nothing before the sweep measured anything (a tuning point scored counts: its table is shown)."""
    if state is not None and (state.forwards or state.tuning):
        print("stopped: writing the tables of what finished (--resume completes them)", file=sys.stderr)
        _write(state, cfg, corpus, opened, complete=False)


def _write(state: RunState, cfg: ExtendConfig, corpus: Any, opened: Run, complete: bool) -> dict[str, Any]:
    """Save the state and write the results of the cells done; `complete` False: a stopped run's, marked so."""
    state.save()
    meta = run_meta(state, cfg, {"name": corpus.name, "sha256": corpus.sha256}, opened.wall_seconds, complete)
    for path in write_results(state, cfg, meta):
        print(f"wrote {path}")
    longest = longest_forward(state.forwards)
    if longest:
        gpu = f", peak GPU memory {longest['peak_gpu_gib']:.2f} GiB" if longest.get("peak_gpu_gib") else ""
        print(f"longest forward: {longest['length']} tokens in {longest['seconds']:.0f} s "
              f"({longest['cpu_seconds']:.0f} CPU s), peak RSS {longest['peak_rss_gib']:.2f} GiB{gpu}")
    return meta
