"""Typed training configuration: YAML file + `key.sub=value` command-line overrides.

Every section forbids unknown keys, so a typo fails at load with a message naming the key; names
that select a pluggable part (estimator, reward, engine, protocol, GT source) are checked against
their registries' names at load too, without importing the parts: loading a preset imports no
torch (the registries live in light modules, `Registry.check` imports nothing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from pvpo.bounded_yaml import YAMLBoundsError, load_yaml
from pvpo.secrets import check_url, mask_value
from pvpo.trainer.algorithms.spec import NO_GT_ROWS, check_aggregation, samples_extra_rollouts
from pvpo.trainer.config.algorithm import AlgorithmConfig
from pvpo.trainer.config.policy import ModelConfig
from pvpo.trainer.config.rollout import (  # noqa: F401 (the section's classes, importable from here too)
    MAX_STALENESS,
    ImportanceCorrectionConfig,
    RolloutConfig,
    VLLMConfig,
)
from pvpo.trainer.config.section import Section


class SyntheticConfig(Section):
    """Parameters of `pvpo.envs.synthetic.SyntheticWorld.generate`."""

    seed: int = Field(0, description="seed of the generated world")
    n_entities: int = Field(60, ge=6, description="entities in the world")
    n_relations: int = Field(4, ge=1, le=6, description="relations between entities")
    max_hops: int = Field(4, ge=1, le=4, description="longest chain of relations a question follows")
    questions_per_hop: int = Field(150, ge=1, description="questions generated per hop count")
    test_fraction: float = Field(
        0.2, gt=0, lt=1, description="share of each hop's questions held out as the test split"
    )


QUESTIONS_CORPUS = "questions"  # data.corpus: index the paragraphs the questions ship with


class DataConfig(Section):
    source: str | list[str] = Field(
        "synthetic",
        description="synthetic, or a QA file readable by pvpo.envs.loaders.load_dataset, or a list of such files (one "
        "question pool; uids carry each file's dataset name)",
    )
    synthetic: SyntheticConfig = SyntheticConfig()
    eval_source: str | None = Field(None, description="a QA file for evaluation when `source` is a file")
    corpus: str | None = Field(
        None,
        description="corpus file to index when `source` is a file and retriever.url is null; `questions` = the "
        "paragraphs the questions ship with (HotpotQA's context, MuSiQue's paragraphs), held-out questions' included",
    )
    max_train_examples: int | None = Field(None, ge=1, description="RL prompts taken from the train split; null = all")
    max_eval_examples: int | None = Field(64, ge=1, description="held-out questions evaluated; null = all")
    prompts_per_step: int = Field(4, ge=1, description="distinct prompts per step, each rolled out rollout.n times")
    shuffle_seed: int | None = Field(
        None,
        description="shuffle the train and eval questions before taking the first max_*_examples (the synthetic splits are otherwise ordered by hop count); null = file order",
    )
    warm_start_examples: int | None = Field(
        None,
        ge=1,
        description="SFT questions taken from the train split after the RL prompts, so the warm start never sees an RL prompt (synthetic: the oracle's trajectories; a QA file: the dataset's GT, see algorithm.gt.source=dataset); null = the warm start reuses the RL prompts (synthetic only)",
    )
    held_out_examples: int | dict[str, int] | None = Field(
        None,
        description="a QA file without eval_source: this many questions of `source` (after shuffle_seed) are the held-out set, shared with neither the RL prompts nor the warm start; a mapping {dataset: n} draws n from each dataset named (the uid prefix: the file's dataset name, e.g. musique_dev), a stratified split; null = no held-out set from `source`",
    )
    validation_examples: int | dict[str, int] | None = Field(
        None,
        description="questions of `source` set aside, after the held-out set, for choosing settings (written to validation.jsonl; never trained on); an int or a {dataset: n} mapping as for held_out_examples; null = none",
    )
    evaluate_on: Literal["held_out", "validation"] = Field(
        "held_out",
        description="the split the run evaluates (before and after RL): `validation` when comparing settings, so the held-out set is never used to choose",
    )
    warm_start_max_hops: int | None = Field(
        None, ge=1, le=4, description="the warm start's questions have at most this many hops; null = any"
    )
    require_supporting_paragraphs: bool = Field(
        False,
        description="drop (and count) the questions of `source` whose own paragraphs lack a supporting one: with "
        "data.corpus=questions no search can find their evidence (303 of the 683 HotpotQA-hard sample ship "
        "retrieved contexts without their gold paragraphs)",
    )

    @field_validator("held_out_examples", "validation_examples")
    @classmethod
    def _split_sizes(cls, v: int | dict[str, int] | None, info: Any) -> int | dict[str, int] | None:
        sizes = v.values() if isinstance(v, dict) else [] if v is None else [v]
        if any(n < 1 for n in sizes):
            raise ValueError(f"data.{info.field_name}: every count must be >= 1, got {v}")
        return v

    @model_validator(mode="after")
    def _validation_split_exists(self) -> DataConfig:
        if self.evaluate_on == "validation" and not self.validation_examples:
            raise ValueError("data.evaluate_on=validation needs data.validation_examples (an int or {dataset: n})")
        return self


class RetrieverConfig(Section):
    url: str | list[str] | None = Field(
        None,
        description="an existing /retrieve server, or a list of replicas (the client round-robins over them, e.g. one per node of a multi-node run); null = index the corpus and serve it on loopback",
    )
    index_dir: str | None = Field(None, description="reuse a built index; null = build one under the run dir")
    encoder: str | None = Field(
        None, description="sentence-transformers model of a built index; null = the packaged MiniLM"
    )
    encoder_backend: str | None = Field(
        None,
        description="runtime of the loopback index's encoder (build and queries): torch | onnx | onnx-int8 | openvino; null = $PVPO_ENCODER_BACKEND, else torch (pvpo.retriever.encoder)",
    )
    encoder_dtype: Literal["float32", "float16", "bfloat16", "auto"] | None = Field(
        None,
        description="torch dtype of the loopback index's encoder (build and queries); null = float16 on GPU, "
        "float32 on CPU; auto = bfloat16 where the CPU computes it natively (AVX512-BF16 or AMX, not capped by "
        "ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA), float32 on other CPUs, float16 on GPU. bfloat16 on a CPU "
        "with AVX512-BF16 encodes MiniLM 1.9x faster (43 -> 83 passages/s, cosine to float32 >= 0.9999); "
        "emulated on an AVX2-only CPU it runs ~8x slower than float32",
    )
    topk: int = Field(2, ge=1, description="passages returned per search")
    token: str | None = Field(
        None,
        description="bearer token of an authenticated `url`; null = the "
        "PVPO_RETRIEVER_TOKEN environment variable (keeps the secret out of the run's config.yaml)",
    )
    timeout: float = Field(30.0, gt=0, description="seconds one /retrieve request may take before it is retried")
    retries: int = Field(
        8,
        ge=0,
        description="retries after a failed request (connection error, timeout, 429/5xx), "
        "with backoff 0.2 s doubling up to max_backoff: the default 8 wait about 18 s in all, "
        "enough to ride out a server restart (~10 s to reload an index)",
    )
    max_backoff: float = Field(4.0, gt=0, description="the longest wait between two retries, in seconds")

    @field_validator("token", mode="before")
    @classmethod
    def _token_as_text(cls, v: Any) -> Any:
        # YAML reads an all-digit token as a number; it is a token all the same
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("url")
    @classmethod
    def _url_parses(cls, v: str | list[str] | None) -> str | list[str] | None:
        for url in [v] if isinstance(v, str) else v or []:  # refused at load, before any file is written
            check_url(url, "URL")
        return v

    @field_validator("encoder_backend")
    @classmethod
    def _known_encoder_backend(cls, v: str | None) -> str | None:
        from pvpo.retriever.encoder import check_backend

        return None if v is None else check_backend(v)


class EnvConfig(Section):
    protocol: str = Field("search_r1", description="tag protocol: search_r1 | research (pvpo.reward)")
    max_obs_chars: int = Field(400, ge=16, description="character budget of one search result's passages")
    max_question_chars: int = Field(
        4096,
        ge=16,
        description="longer questions are cut to this many characters, with a warning counting them "
        "(about 4 characters a token x 1024 prompt tokens)",
    )
    prompt_template: str = Field(
        "default", description="a name in pvpo.envs.templates: default | search_r1 (Search-R1's exact prompt)"
    )

    @field_validator("prompt_template")
    @classmethod
    def _known_template(cls, v: str) -> str:
        from pvpo.envs.templates import TEMPLATES

        return TEMPLATES.check(v)

    @field_validator("protocol")
    @classmethod
    def _known_protocol(cls, v: str) -> str:
        from pvpo.reward import get_protocol

        get_protocol(v)  # pvpo.reward is pure text: nothing heavy to import
        return v


class OptimConfig(Section):
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    epochs: int = Field(1, ge=1, description="PPO epochs over one rollout batch")
    mini_batches: int = Field(1, ge=1, description="optimizer steps per epoch")
    grad_accum: int = Field(
        1, ge=1, description="micro-batches per mini-batch (when max_tokens_per_micro_batch is null)"
    )
    max_tokens_per_micro_batch: int | None = Field(
        None,
        ge=16,
        description="pack each mini-batch into micro-batches of at most this many padded tokens (rows x longest row), longest rows first; null = derived from the model's shape and the free memory (trainer/model/memory.py), or grad_accum micro-batches by row count when grad_accum > 1",
    )
    grad_clip: float | None = Field(1.0, gt=0, description="clip the gradient norm to this; null = no clipping")
    clip_low: float = Field(0.2, ge=0, description="PPO ratio clipped below 1 - clip_low")
    clip_high: float = Field(0.28, ge=0, description="PPO ratio clipped above 1 + clip_high")
    dual_clip: float | None = Field(None, gt=1, description="dual-clip bound on negative-advantage tokens; null = off")
    kl_coef: float = Field(
        0.0, ge=0, description="weight of the KL to the frozen reference; 0 = no reference model loaded for KL"
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3",
        description="KL estimator: k2 (the reverse KL's gradient) | k3 (verl's low_var_kl: the forward KL's gradient); k1 is refused (its gradient is zero in expectation)",
    )
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus weight")
    loss_agg: str | None = Field(
        None, description="null = the estimator's own (dr_grpo: seq-mean-token-sum-norm, others: token-mean)"
    )
    loss_norm_len: int | None = Field(
        None, ge=1, description="seq-mean-token-sum-norm's constant divisor; null = rollout.max_response_tokens"
    )

    @field_validator("loss_agg")
    @classmethod
    def _known_agg(cls, v: str | None) -> str | None:
        return None if v is None else check_aggregation(v)

    @field_validator("kl_estimator")
    @classmethod
    def _kl_with_a_gradient(cls, v: str) -> str:
        if v == "k1":  # trainer/algorithms/losses.py `kl_penalty`: E[grad (lp - ref)] = E[grad lp] = 0
            raise ValueError(
                "optim.kl_estimator=k1 has a zero expected gradient (the penalty would do nothing): "
                "use k2 (the reverse KL's gradient) or k3 (verl's low_var_kl)"
            )
        return v


class RunConfig(Section):
    steps: int = Field(
        2,
        ge=0,
        description="training steps; 0 = the warm start alone: its policy saved to <run>/initial_policy and not "
        "evaluated by the run (`pvpo eval` it on <run>/held_out.jsonl)",
    )
    seed: int = Field(0, description="seed of sampling, data order and initialisation")
    checkpoint_every: int = Field(1, ge=0, description="checkpoint every this many steps; 0 = only at the end")
    eval_every: int = Field(
        0,
        ge=0,
        description="evaluate the validation split (data.validation_examples; else the evaluation set) every this many "
        "steps, logged as val/* (eval/* without a validation split), keeping the checkpoint with the best validation "
        "EM beside the newest; 0 = only before and after",
    )
    eval_temperature: float = Field(0.0, ge=0, description="sampling temperature of evaluation; 0 = greedy")
    eval_top_p: float = Field(
        1.0, gt=0, le=1, description="nucleus sampling for evaluation (PVPO evaluates at T=0.6, top-p 0.95)"
    )
    rollout_budget: int | None = Field(
        None,
        ge=1,
        description="stop after the step whose cumulative rollouts (anchor and GT generation included) reach this; "
        "null = run.steps only (estimators compared at equal rollout cost)",
    )
    tensorboard: bool = Field(True, description="write TensorBoard events")
    keep_episodes: int = Field(
        8,
        ge=0,
        description="sampled episodes kept per step in episodes.jsonl for `pvpo view` (whole groups drawn at random, "
        "GT rows with their pi_gt), beside every row's reward and advantage; 0 = write no episodes.jsonl",
    )
    threads: int | None = Field(None, ge=1, description="torch CPU threads; null = torch's default")
    eval_base: bool = Field(
        False,
        description="with a warm start, also evaluate the policy before it (`base`), so the summary tells the warm "
        "start's gain from RL's",
    )


class TrainConfig(Section):
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    retriever: RetrieverConfig = RetrieverConfig()
    env: EnvConfig = EnvConfig()
    rollout: RolloutConfig = RolloutConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    optim: OptimConfig = OptimConfig()
    run: RunConfig = RunConfig()

    @model_validator(mode="after")
    def _questions_corpus_needs_qa_files(self) -> TrainConfig:
        if self.data.corpus == QUESTIONS_CORPUS and self.data.source == "synthetic":
            raise ValueError(
                "data.corpus=questions indexes the paragraphs of QA files: give them as data.source, e.g. "
                "'data.source=[hotpotqa/questions.json, musique/questions.json]'"
            )
        return self

    @model_validator(mode="after")
    def _warm_start_needs_gt(self) -> TrainConfig:
        # the warm start is SFT on GT trajectories: the synthetic world's oracle, or on a QA file the
        # dataset's own annotation for a set of questions disjoint from the RL prompts
        if self.model.warm_start_steps and self.data.source != "synthetic" and not self.data.warm_start_examples:
            raise ValueError(
                f"model.warm_start_steps={self.model.warm_start_steps} on data.source={self.data.source!r} needs "
                "data.warm_start_examples (questions set aside for SFT on the dataset's GT: MuSiQue's "
                "decomposition or HotpotQA's supporting facts); or set model.warm_start_steps=0"
            )
        if not self.run.steps and not self.model.warm_start_steps:
            raise ValueError("run.steps=0 runs the warm start alone: set model.warm_start_steps, or run.steps >= 1")
        return self


class ConfigError(ValueError):
    """A configuration that cannot be loaded; the message names the offending key."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a","b","c"], value parsed as YAML scalar/list/dict)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key.sub=value")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        return parts, load_yaml(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        what = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"override {key.strip()}=...: its value is not YAML ({what}): quote it, or fix it") from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set each `key.sub=value` into a nested dict (creating sections as needed)."""
    for item in overrides:
        parts, value = parse_override(item)
        node = data
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {p!r} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return data


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        shown = mask_value(".".join(str(p) for p in e["loc"]), e.get("input"))  # a secret is never echoed
        lines.append(f"  {key}: {msg} (got {shown!r})" if e["type"] != "extra_forbidden" else f"  {key}: {msg}")
    return "invalid config:\n" + "\n".join(lines)


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """Validate a nested dict; raise ConfigError naming every bad key."""
    try:
        cfg = TrainConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e)) from None
    check_staleness_estimator(cfg)
    check_group_sampling(cfg)
    return cfg


def check_staleness_estimator(cfg: TrainConfig) -> None:
    """Refuse (one line) rollouts ahead of the update with an estimator that samples more rollouts
    after seeing a step's first ones (V0.5): the pipelined loop plans a step's episodes before its
    update, so it cannot."""
    eta, name = cfg.rollout.max_staleness, cfg.algorithm.estimator
    if eta > 0 and samples_extra_rollouts(name):
        raise ConfigError(
            f"rollout.max_staleness={eta}: algorithm.estimator={name} samples more rollouts after seeing a step's "
            "first ones, which rollouts ahead of the update cannot: set rollout.max_staleness=0 or another estimator"
        )


def check_group_sampling(cfg: TrainConfig) -> None:
    """Refuse (one line) Group Sampling where its GT rows cannot be had or used: an estimator that
    takes none (`NO_GT_ROWS`), the oracle off the synthetic world, an endpoint whose log-probs would
    be the PPO ratio's pi_gt."""
    alg, gt = cfg.algorithm, cfg.algorithm.gt
    if not alg.group_sampling.enabled:
        return
    why = NO_GT_ROWS.get(alg.estimator)
    if why:
        raise ConfigError(
            f"algorithm.estimator={alg.estimator} takes no Group Sampling GT rows ({why}): set "
            "algorithm.group_sampling.enabled=false, or use another estimator"
        )
    if gt.source == "oracle" and cfg.data.source != "synthetic":
        raise ConfigError(
            "algorithm.gt.source=oracle needs the synthetic world (data.source: synthetic): on a QA file set "
            "algorithm.gt.source=dataset or model, or algorithm.group_sampling.enabled=false"
        )
    if gt.source == "model" and gt.model.base_url and gt.logprobs != "reference":
        raise ConfigError(
            "algorithm.gt.model.base_url: an endpoint may return no log-probs, or log-probs over its own "
            "tokenization: set algorithm.gt.logprobs=reference"
        )


def _read_yaml(path: Path) -> Any:
    """A YAML file's content; a syntax error or a non-UTF-8 byte is a ConfigError naming the file,
    line and column."""
    try:
        return load_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: byte {e.start}: not UTF-8: re-save the config as UTF-8") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"
        what = " ".join(str(x) for x in (getattr(e, "problem", None), getattr(e, "context", None)) if x) or str(e)
        kind = "YAML refused" if isinstance(e, YAMLBoundsError) else "YAML syntax error"
        raise ConfigError(f"{path}: {where}: {kind} ({what}): fix the file there") from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML config (or the defaults when `path` is None) and apply overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        loaded = _read_yaml(Path(path))
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
        data = loaded or {}
    optim = data.get("optim")
    file_agg = optim.get("loss_agg") if isinstance(optim, dict) else None
    cfg = config_from_dict(apply_overrides(data, list(overrides or [])))
    check_preset_aggregation(file_agg, list(overrides or []), cfg, path)
    return cfg


def check_preset_aggregation(file_agg: Any, overrides: list[str], cfg: TrainConfig, path: str | Path | None) -> None:
    """Refuse an estimator given on the command line whose own loss aggregation (Dr.GRPO's
    constant-length one) the config file's `optim.loss_agg` would silently replace (a ConfigError
    naming both and the fix); an `optim.loss_agg` given beside it is the user's choice."""
    from pvpo.trainer.algorithms.spec import own_aggregation

    keys = {".".join(parse_override(o)[0]) for o in overrides}
    own = own_aggregation(cfg.algorithm.estimator)
    if not file_agg or "algorithm.estimator" not in keys or "optim.loss_agg" in keys or own in ("token-mean", file_agg):
        return
    raise ConfigError(
        f"algorithm.estimator={cfg.algorithm.estimator} aggregates its loss with {own}, which {path}'s "
        f"optim.loss_agg={file_agg} would replace: add optim.loss_agg=null to follow the estimator, or "
        f"optim.loss_agg={file_agg} to keep the file's"
    )
