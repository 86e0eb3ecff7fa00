"""`pvpo eval`: evaluate a policy per dataset (FlashRAG-layout predictions, metrics, LLM judge),
merge runs into a table, re-score prediction files. Heavy imports stay inside the commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from pvpo.secrets import check_url, mask_url
from pvpo.signals import stop_on_signals
from pvpo.trainer.rollout.engine import DEFAULT_ENGINE, available_engines
from pvpo.user_errors import add_note, request_traceback

eval_app = typer.Typer(
    name="eval",
    help="Evaluate a search agent per dataset (EM/F1/CEM, LLM judge); `report` merges runs into a table; `rescore` re-scores a file.",
    invoke_without_command=True,
    no_args_is_help=True,
)


def _judge(base_url: str, model: str, api_key: str | None, api: str, concurrency: int) -> Any:
    from pvpo.evaluation.judge import Judge
    from pvpo.trainer.rollout.openai_client import OpenAIClient

    if api not in ("chat", "completions"):
        raise ValueError(f"--judge-api {api!r}: one of ['chat', 'completions']")
    return Judge(OpenAIClient(base_url, model, api_key=api_key), api=api, concurrency=concurrency)


@eval_app.callback()
def eval_cmd(
    ctx: typer.Context,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Local HF model folder, catalog name (`pvpo models list`) or *.gguf file (engines hf, vllm); with --engine openai, only the run's label",
        ),
    ] = None,
    dataset: Annotated[
        list[str] | None,
        typer.Option(
            "--dataset",
            "-d",
            help="A question file (HotpotQA, MuSiQue, 2WikiMultihopQA or FlashRAG, json or jsonl: the format is "
            "detected) or a benchmark name (nq, triviaqa, popqa, hotpotqa, 2wiki, musique, bamboogle) in --data-dir; "
            "repeat for several",
        ),
    ] = None,
    name: Annotated[
        list[str] | None,
        typer.Option(
            "--name",
            help="Name of each --dataset, in order (its results folder OUT/<name>/ and its uids' prefix); default: "
            "the file's name, or its folder's for a generic one (hotpotqa_mini/questions.json -> hotpotqa_mini)",
        ),
    ] = None,
    retriever_url: Annotated[
        list[str] | None, typer.Option("--retriever-url", help="Search-R1 /retrieve server(s), round-robin")
    ] = None,
    retriever_token: Annotated[
        str | None,
        typer.Option(
            "--retriever-token",
            envvar="PVPO_RETRIEVER_TOKEN",
            show_default=False,
            help="Bearer token of a `pvpo retriever serve --token` server",
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Output folder; each dataset goes to OUT/<dataset>/")
    ] = None,
    split: Annotated[
        str | None, typer.Option(help="Split (default: the benchmark's evaluation split, test or dev)")
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", envvar="PVPO_DATA_DIR", help="Folder of FlashRAG datasets (<name>/<split>.jsonl)"),
    ] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="Evaluate N questions (the first N, or a draw with --sample-seed)")
    ] = None,
    sample_seed: Annotated[
        int | None,
        typer.Option("--sample-seed", help="Seed of the random N-question subset (recorded in metrics.json)"),
    ] = None,
    engine: Annotated[str, typer.Option(help=f"{' | '.join(available_engines())} | openai")] = DEFAULT_ENGINE,
    template: Annotated[
        str, typer.Option(help="Prompt template / tag protocol, e.g. search_r1, research")
    ] = "search_r1",
    temperature: Annotated[float, typer.Option(help="0 = greedy (default); PVPO used 0.6")] = 0.0,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling (PVPO used 0.95)")] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k", help="-1 = off")] = -1,
    max_turns: Annotated[int, typer.Option("--max-turns")] = 6,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Model tokens per turn")] = 512,
    max_response_tokens: Annotated[
        int, typer.Option("--max-response-tokens", help="Whole response (model + env tokens; openai: model tokens)")
    ] = 4096,
    max_completion_tokens: Annotated[
        int,
        typer.Option(
            "--max-completion-tokens",
            help="Model tokens per question, all turns together (0 = no bound of its own): a degenerate answer "
            "ends here instead of at max-turns x max-new-tokens",
        ),
    ] = 1024,
    repetition_stop: Annotated[
        int,
        typer.Option(
            "--repetition-stop",
            help="End a question whose turn falls into a loop: its last N tokens repeating the N before them "
            "at a period of at most 32 tokens (0 = off)",
        ),
    ] = 32,
    topk: Annotated[int, typer.Option(help="Passages per search")] = 3,
    max_obs_chars: Annotated[
        int | None,
        typer.Option("--max-obs-chars", help="Trim a search result to this many characters (default: no trim)"),
    ] = None,
    batch_size: Annotated[
        int,
        typer.Option(
            "--batch-size",
            help="Questions in flight at once; each answer is saved as it ends (a resume redoes only unanswered ones)",
        ),
    ] = 32,
    seed: Annotated[int, typer.Option(help="Sampling seed")] = 0,
    chat_template: Annotated[
        bool | None,
        typer.Option(
            "--chat-template/--no-chat-template",
            help="Wrap the prompt in the tokenizer's chat template (default: when it has one)",
        ),
    ] = None,
    dtype: Annotated[str, typer.Option(help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16")] = "auto",
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads",
            min=1,
            show_default=False,
            help="torch CPU threads (default: the CPUs other work leaves idle, from the load average; "
            "OMP_NUM_THREADS where set)",
        ),
    ] = None,
    engine_option: Annotated[
        list[str] | None,
        typer.Option(
            "--engine-option",
            help="KEY=VALUE passed to the local engine (repeat), as the training config's rollout.<engine> "
            "section, e.g. kv_cache_memory_bytes=1073741824 for vllm",
        ),
    ] = None,
    base_url: Annotated[
        str | None,
        typer.Option("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8001/v1 (engine openai)"),
    ] = None,
    model_name: Annotated[str | None, typer.Option("--model-name", help="Model name at --base-url")] = None,
    api: Annotated[str, typer.Option(help="completions (text prompt) | chat (messages)")] = "completions",
    api_key: Annotated[
        str | None, typer.Option("--api-key", envvar="OPENAI_API_KEY", help="Bearer token for --base-url")
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Concurrent requests to --base-url")] = 16,
    judge_base_url: Annotated[
        str | None, typer.Option("--judge-base-url", help="OpenAI-compatible endpoint of the LLM judge")
    ] = None,
    judge_model: Annotated[str | None, typer.Option("--judge-model", help="Judge model name")] = None,
    judge_api_key: Annotated[str | None, typer.Option("--judge-api-key", envvar="PVPO_JUDGE_API_KEY")] = None,
    judge_api: Annotated[str, typer.Option("--judge-api", help="chat | completions")] = "chat",
    label: Annotated[str | None, typer.Option(help="Method name in report tables (default: the model's name)")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bars")] = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Write into an --out holding other files (kept), replacing a dataset's folder that holds "
            "another run (kept until the new run's first answers)",
        ),
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Full tracebacks")] = False,
) -> None:
    """Evaluate a policy on one or more datasets: `pvpo eval --model PATH --dataset nq --retriever-url URL --out DIR`."""
    if debug:
        request_traceback()
    if ctx.invoked_subcommand is not None:
        return
    missing = [f"--{k}" for k, v in (("dataset", dataset), ("retriever-url", retriever_url), ("out", out)) if not v]
    if engine == "openai":
        missing += [f"--{k}" for k, v in (("base-url", base_url), ("model-name", model_name)) if not v]
    elif not model:
        missing.append("--model")
    if missing:
        raise ValueError(f"missing {', '.join(missing)} (see pvpo eval --help)")
    if bool(judge_base_url) != bool(judge_model):
        raise ValueError("--judge-base-url and --judge-model go together")
    urls = [("--retriever-url", u) for u in retriever_url or []]
    urls += [(o, u) for o, u in (("--base-url", base_url), ("--judge-base-url", judge_base_url)) if u]
    for option, url in urls:  # a URL the HTTP client cannot parse, refused before anything is loaded or written
        check_url(url, option)
    from pvpo.evaluation.run import EvalSettings

    settings = EvalSettings(
        template=template,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        max_turns=max_turns,
        max_new_tokens=max_new_tokens,
        max_response_tokens=max_response_tokens,
        topk=topk,
        max_obs_chars=max_obs_chars,
        batch_size=batch_size,
        seed=seed,
        chat_template=chat_template,
        max_completion_tokens=max_completion_tokens or None,
        repetition_stop=repetition_stop,
    )
    _run(
        model=model,
        datasets=list(dataset or []),
        names=list(name or []),
        retriever_urls=list(retriever_url or []),
        out=out,  # type: ignore[arg-type]
        retriever_token=retriever_token or None,
        split=split,
        data_dir=data_dir,
        limit=limit,
        sample_seed=sample_seed,
        engine=engine,
        settings=settings,
        dtype=dtype,
        engine_options=parse_engine_options(engine_option or [], engine),
        base_url=base_url,
        model_name=model_name,
        api=api,
        api_key=api_key,
        concurrency=concurrency,
        judge=_judge(judge_base_url, judge_model, judge_api_key, judge_api, concurrency) if judge_base_url else None,  # type: ignore[arg-type]
        label=label,
        quiet=quiet,
        overwrite=overwrite,
        threads=threads,
    )


SET_BY_EVAL = frozenset({"dtype", "micro_batch_size", "device"})  # --dtype, --batch-size and the machine


def parse_engine_options(items: list[str], engine: str) -> dict[str, Any]:
    """`--engine-option KEY=VALUE` pairs as keyword arguments of `engine`'s constructor, each value
    read as YAML (numbers, booleans, null); a malformed pair or a key the engine does not take is a
    one-line error listing the keys it takes."""
    import inspect

    import yaml

    from pvpo.trainer.rollout.engine import ENGINES

    if not items:
        return {}
    if engine == "openai":
        raise ValueError("--engine-option: the openai engine takes none (it is a remote endpoint)")
    factory = ENGINES.get(engine).factory
    sig = inspect.signature(factory)
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):  # a builder passing **kwargs on: its class's
        ret = sig.return_annotation
        cls = getattr(inspect.getmodule(factory), ret, None) if isinstance(ret, str) else ret
        sig = inspect.signature(cls) if callable(cls) else sig
    params = sig.parameters
    known = sorted(k for k, p in params.items() if p.kind == p.KEYWORD_ONLY and k not in SET_BY_EVAL)
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--engine-option {item!r}: expected KEY=VALUE, e.g. kv_cache_memory_bytes=1073741824")
        if key not in known:
            raise ValueError(f"--engine-option {key}: not an option of engine {engine}; known: {known}")
        out[key] = yaml.safe_load(value)
    return out


def _run(
    *,
    model: str | None,
    datasets: list[str],
    names: list[str] | None = None,
    retriever_urls: list[str],
    retriever_token: str | None,
    out: Path,
    split: str | None,
    data_dir: Path | None,
    limit: int | None,
    sample_seed: int | None,
    engine: str,
    settings: Any,
    dtype: str,
    base_url: str | None,
    engine_options: dict[str, Any] | None = None,
    model_name: str | None,
    api: str,
    api_key: str | None,
    concurrency: int,
    judge: Any,
    label: str | None,
    quiet: bool,
    overwrite: bool = False,
    threads: int | None = None,
) -> None:
    from pvpo.envs.datasets import name_datasets, resolve_dataset, sample_subset
    from pvpo.envs.episode import MAX_QUESTION_CHARS
    from pvpo.envs.loaders import bound_questions, load_dataset
    from pvpo.evaluation.judge import JudgeCache, judge_run
    from pvpo.evaluation.policies import token_policy
    from pvpo.evaluation.run import answered_note, check_out_dir, run_eval
    from pvpo.retriever.client import RetrieverClient

    # fail before loading a model; two datasets of one name would share a results folder
    resolved = name_datasets([resolve_dataset(d, split=split, data_dir=data_dir) for d in datasets], names or [])
    check_out_dir(out, [ds.name for ds in resolved], overwrite=overwrite)
    max_chars = MAX_QUESTION_CHARS  # the episode's prompt cuts at the same length
    subsets = [
        bound_questions(sample_subset(load_dataset(ds.path, name=ds.name), limit, sample_seed), max_chars, ds.path)
        for ds in resolved
    ]
    for ds, examples in zip(resolved, subsets, strict=True):
        if not examples:
            raise ValueError(f"{ds.path} holds no questions: give a dataset with at least one")
    if engine == "openai":
        from pvpo.evaluation.policies import OpenAIPolicy
        from pvpo.trainer.rollout.openai_client import OpenAIClient

        assert base_url is not None and model_name is not None  # the command refuses an openai run without them
        policy: Any = OpenAIPolicy(
            OpenAIClient(base_url, model_name, api_key=api_key), api=api, concurrency=concurrency
        )
        model_id = f"{mask_url(base_url)}#{model_name}"  # credentials in the URL reach no file
    else:
        assert model is not None  # the command refuses a local engine without --model
        from pvpo.hardware import choose_torch_threads

        typer.echo(choose_torch_threads(threads)[1], err=True)
        policy = token_policy(model, engine, dtype=dtype, batch_size=settings.batch_size, engine_options=engine_options)
        model_id = _model_id(model)
    name = label or (model_name if engine == "openai" else _model_label(Path(model)))  # type: ignore[arg-type]
    with (
        stop_on_signals(),
        RetrieverClient(retriever_urls, topk=settings.topk, token=retriever_token) as searcher,
    ):
        for ds, examples in zip(resolved, subsets, strict=True):
            meta = {
                "label": name,
                "dataset": ds.name,
                "split": ds.split,
                "source": str(ds.path.resolve()),
                "limit": limit,
                "sample_seed": sample_seed,
                "model": model_id,
                "engine": engine if engine != "openai" else f"openai-{api}",
            }
            run_dir = out / ds.name
            try:
                m = run_eval(
                    policy,
                    examples,
                    searcher,
                    settings,
                    run_dir,
                    meta=meta,
                    show_progress=not quiet,
                    overwrite=overwrite,
                )
            except (KeyboardInterrupt, OSError) as err:  # the line it ends with says how far it got
                add_note(err, answered_note(run_dir, len(examples)))
                raise
            line = f"{ds.name} ({ds.split}, N={m['n']}): EM {m['em']:.4f} (s.e. {m['em_se']:.4f})  F1 {m['f1']:.4f}  ACC {m['acc']:.4f}"
            if judge is not None:
                judge.cache = JudgeCache(None)  # each run keeps its own cache file
                s = judge_run(run_dir, judge, show_progress=not quiet)
                line += f"  LasJ {s['lasj_mean']:.3f}/5 {s['lasj_distribution']}"
            typer.echo(f"{line}  -> {run_dir}")


def _model_id(model: str) -> str:
    """The model as metrics.json records it: a file or folder as its absolute path; a catalog name
    or hub id as given (resolving `smollm2-135m-instruct` against the working directory recorded
    `/smollm2-135m-instruct` in the eval container, whose working directory is /)."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


def _model_label(path: Path) -> str:
    """A table row name for a model folder: its name, with its parent's for a checkpoint's
    `policy` folder (`step_001005/policy`)."""
    path = path.resolve()
    return f"{path.parent.name}/{path.name}" if path.name in ("policy", "hf", "model") else path.name


@eval_app.command("report")
def report_cmd(
    dirs: Annotated[
        list[Path],
        typer.Argument(help="Run folders (OUT of pvpo eval, or one dataset's folder); one table row per method"),
    ],
    metric: Annotated[str, typer.Option(help="em | f1 | cem (FlashRAG's acc) | lasj | format_ok | searches")] = "em",
    csv_path: Annotated[Path | None, typer.Option("--csv", help="Also write the table as CSV")] = None,
    md_path: Annotated[Path | None, typer.Option("--md", help="Also write the markdown table to a file")] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an existing --md / --csv file (never one a run wrote)")
    ] = False,
) -> None:
    """Merge runs into one markdown table (datasets as columns, Avg last, N per column) and a CSV."""
    from pvpo.atomic import atomic_write_text
    from pvpo.evaluation.report import build_table, find_runs, markdown_table, write_csv
    from pvpo.owned import check_output_files

    check_output_files({"--md": md_path, "--csv": csv_path}, overwrite=overwrite)  # before anything is read

    results = find_runs(dirs, metric)
    if not results:
        raise ValueError(f"no run in {[str(d) for d in dirs]} has metric {metric!r}")
    table = build_table(results)
    text = markdown_table(table, metric=metric)
    if md_path:
        atomic_write_text(md_path, text)
    if csv_path:
        write_csv(table, csv_path)
    typer.echo(text, nl=False)


@eval_app.command("rescore")
def rescore_cmd(
    path: Annotated[
        Path, typer.Argument(help="FlashRAG-format predictions (jsonl, or FlashRAG's intermediate_data.json)")
    ],
    extract: Annotated[
        str | None,
        typer.Option(help="Re-read each pred from output.final_response with this tag protocol (search_r1, research)"),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write the re-scored items (jsonl) here")] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an existing --out file (never one a run wrote)")
    ] = False,
) -> None:
    """Recompute EM / F1 / ACC (cover-EM) of every item and the totals, as FlashRAG's metric_score.txt."""
    from pvpo.atomic import atomic_write_text
    from pvpo.evaluation.report import metric_score_text, rescore_file
    from pvpo.owned import check_output_files
    from pvpo.reward import get_protocol

    check_output_files({"--out": out}, overwrite=overwrite, reads=[path])  # never the predictions it reads
    res = rescore_file(path, extract=get_protocol(extract) if extract else None)
    if out:
        atomic_write_text(out, "".join(json.dumps(it, ensure_ascii=False) + "\n" for it in res.items))
    typer.echo(metric_score_text(res.totals), nl=False)
    note = f"n: {res.totals['n']}; items whose stored metric_score differs: {res.changed_scores}"
    if extract:
        note += f"; items whose stored pred differs from the re-extracted one: {res.changed_preds}"
    typer.echo(note, err=True)


@eval_app.command("judge")
def judge_cmd(
    dirs: Annotated[list[Path], typer.Argument(help="Run folders (one dataset each, or OUT holding several)")],
    judge_base_url: Annotated[str, typer.Option("--judge-base-url", help="OpenAI-compatible endpoint of the judge")],
    judge_model: Annotated[str, typer.Option("--judge-model", help="Judge model name")],
    judge_api_key: Annotated[str | None, typer.Option("--judge-api-key", envvar="PVPO_JUDGE_API_KEY")] = None,
    judge_api: Annotated[str, typer.Option("--judge-api", help="chat | completions")] = "chat",
    concurrency: Annotated[int, typer.Option(help="Concurrent judge requests")] = 16,
    quiet: Annotated[bool, typer.Option("--quiet")] = False,
) -> None:
    """Grade existing runs' predictions 0-5 with an LLM judge (cached); adds LasJ to metrics.json."""
    from pvpo.evaluation.judge import JudgeCache, judge_run
    from pvpo.evaluation.run import PREDICTIONS

    judge = _judge(judge_base_url, judge_model, judge_api_key, judge_api, concurrency)
    runs = [
        d
        for base in dirs
        for d in ([base] if (base / PREDICTIONS).exists() else sorted(p.parent for p in base.glob(f"*/{PREDICTIONS}")))
    ]
    if not runs:
        raise FileNotFoundError(f"no {PREDICTIONS} in {[str(d) for d in dirs]}")
    for run in runs:
        judge.cache = JudgeCache(None)  # each run keeps its own cache file
        s = judge_run(run, judge, show_progress=not quiet)
        typer.echo(f"{run}: LasJ {s['lasj_mean']:.3f}/5 {s['lasj_distribution']}")


def register(app: typer.Typer) -> None:
    """Add `eval` (with `report`, `rescore`, `judge`) to the `pvpo` CLI."""
    app.add_typer(eval_app, name="eval")
