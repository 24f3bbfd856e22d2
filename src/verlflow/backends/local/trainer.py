"""The local GRPO trainer: verl's GRPO on one device (CPU by default), tracked like a verl run.

    mlflow run . --env-manager local -e train -P device=cpu          # recipe smoke, profile cpu

It reads the same composed config as the verl backend and reads top to bottom like a torchtune recipe:
:meth:`LocalTrainer.setup` (check the config, load data, model, reference model, optimizer, resume),
:meth:`LocalTrainer.train` (per step: generate → reward → old log-probs → reference log-probs →
advantages → PPO update, validation every ``test_freq`` steps, checkpoints every ``save_freq`` and
at the end), then cleanup. Per step it logs verl's metric names and timers (``timing_s/gen``,
``actor/pg_loss``, ``critic/score/mean``, ``val-core/openai/gsm8k/reward/mean_at_1``, …) computed by
verl's own ``metric_utils``, a rollout samples table ``samples/step_<N>.json`` every ``test_freq``
steps, and a progress bar. Arithmetic per step: train_batch_size prompts x rollout.n samples = B
responses; ppo_epochs x (B / (ppo_mini_batch_size x n)) optimizer steps.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from verlflow import stopping
from verlflow.backends.local import checkpoint as ckpt
from verlflow.backends.local import run_record
from verlflow.backends.local.models import (
    apply_thread_count,
    build_optimizer_and_scheduler,
    load_model,
    load_tokenizer,
    make_deterministic,
    restore_determinism,
    torch_device,
)
from verlflow.backends.local.rollout import PromptSet, encode_prompts, reward_fn_from_config
from verlflow.backends.local.settings import LocalSettings, read_settings
from verlflow.backends.local.step import PHASES, grpo_step, timer, validate
from verlflow.device.cpu_share import ThreadGovernor
from verlflow.errors import VerlflowError
from verlflow.names import (
    DETERMINISTIC_TAG,
    MODEL_PARAMS_TAG,
    RESUMED_FROM_TAG,
    SUPERSEDED_STEPS_TAG,
    TIMING_STEP,
)
from verlflow.out_of_memory import is_out_of_memory, out_of_memory_error
from verlflow.platforms import Device
from verlflow.tracking.run_logger import RunLogger, logger_of
from verlflow.util import first_line

log = logging.getLogger(__name__)

# Run folders (checkpoints under <root>/<run_id>/checkpoints) unless the recipe's verlflow.output_dir says.
DEFAULT_OUTPUT_ROOT = "outputs/local"
StepCallback = Callable[[int, dict[str, float]], None]


@dataclass
class TrainResult:
    """What a finished local training run hands to the next step (evaluate, register)."""

    # <default_local_dir>/global_step_<N>/actor/huggingface: the Hugging Face folder to register.
    final_checkpoint: Path
    # The global step reached (trainer.total_training_steps, or steps/epoch x total_epochs).
    steps: int
    run_id: str
    # The last step's metrics (verl names, unsanitized) and the end-of-run summaries.
    metrics: dict[str, float] = field(default_factory=dict)


def train_local(
    cfg: Any, *, data_dir: str | Path | None = None, run_id: str | None = None, started_at: float | None = None,
    on_step_end: StepCallback | None = None, logger: RunLogger | None = None,
) -> TrainResult:
    """Train with GRPO on one device, logging into the run through ``logger``; return the final checkpoint.

    ``cfg`` is a ``verlflow.config.ComposedConfig``; ``data_dir`` holds ``train.parquet`` and
    ``test.parquet`` (default: ``data.train_files`` / ``data.val_files``). ``on_step_end(step, metrics)``
    runs after each step is logged and checkpointed (Optuna pruning; raising from it stops the run).
    ``logger`` is the one the train step opened for run ``run_id``; without it, the active run's
    (:func:`verlflow.tracking.run_logger.logger_of`: a caller outside the train step, a test or a bench).
    """
    started_at = time.time() if started_at is None else started_at
    logger = logger or logger_of(run_id)
    cfg = with_run_folder(cfg, logger.run_id)
    trainer = LocalTrainer(cfg, read_settings(cfg), data_dir=data_dir, logger=logger)
    try:
        trainer.setup()
        return trainer.train(on_step_end=on_step_end, started_at=started_at)
    except KeyboardInterrupt:  # a stop (Ctrl-C, SIGTERM): the last whole step is kept, and the stop line says where
        trainer.keep_on_stop()
        raise
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        raise _out_of_memory(trainer) from None
    finally:
        trainer.cleanup()


def _out_of_memory(trainer: LocalTrainer) -> VerlflowError:
    """The one line for a trainer out of memory: the step, and the sizes that set its memory (largest lever first:
    one step generates train_batch_size x n responses at once)."""
    s = trainer.settings
    batch = {"data.train_batch_size": s.train_batch_size, "actor_rollout_ref.rollout.n": s.n}
    sizes = {**dict(sorted(batch.items(), key=lambda kv: -kv[1])), "data.max_response_length": s.max_response_length,
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": s.ppo_micro_batch_size,
             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": s.log_prob_micro_batch}
    total = getattr(trainer, "total_steps", None)  # set once set-up has read the data
    step = trainer.global_step  # counted up as a step starts: 0 is set-up or the validation before training
    where = f"in the local trainer at step {step} of {total}" if total and step else "in the local trainer's set-up"
    return out_of_memory_error(where, sizes)


def with_run_folder(cfg: Any, run_id: str) -> Any:
    """``cfg`` with ``trainer.default_local_dir`` = ``<verlflow.output_dir>/<run_id>/checkpoints`` unless set.

    As the verl backend does: a new run gets a fresh folder and so never resumes another run's checkpoint
    (verl's ``resume_mode=auto`` would), while the same run restarted (``mlflow run --run-id``) resumes.
    The params logged afterwards show the folder actually used.
    """
    key = "trainer.default_local_dir"
    if key in cfg.overrides:
        folder = Path(str(OmegaConf.select(cfg.resolved, key))).expanduser().resolve()
    else:
        root = Path(str(cfg.verlflow.output_dir or DEFAULT_OUTPUT_ROOT)).expanduser().resolve()
        folder = root / run_id / "checkpoints"
    resolved = copy.deepcopy(cfg.resolved)
    OmegaConf.update(resolved, key, str(folder))
    return dataclasses.replace(cfg, resolved=resolved, overrides={**cfg.overrides, key: str(folder)})


class LocalTrainer:
    """One GRPO run: setup → train → save → cleanup. Attributes hold the run's live state."""

    def __init__(self, cfg: Any, settings: LocalSettings, *, data_dir: str | Path | None, logger: RunLogger):
        self.cfg, self.settings, self.data_dir = cfg, settings, data_dir
        self.logger, self.run_id = logger, logger.run_id  # the run's only way in: every write goes through it
        self.global_step = 0
        self.logged_through = -1  # steps <= this are already in the run (a resumed run): not re-logged
        self.ref_model: Any = None
        self.last_saved: Path | None = None
        self.progress: Any = None
        self.determinism_before: dict[str, Any] | None = None
        self.governor: ThreadGovernor | None = None

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        """Log what is ignored and the run's params/tags, then load data, models, optimizer, state."""
        from transformers.utils import logging as hf_logging

        from verlflow.models.model_path import resolve_model_path

        hf_logging.disable_progress_bar()  # one progress bar on the console: the trainer's
        run_record.log_run_description(self.cfg, self.settings, self.logger)
        stopping.stop_point()  # set-up's safe points: between its phases (each bounded: a load, a store call)
        self.device = torch_device(self.settings.device)
        threads = apply_thread_count(self.cfg.profile.env)
        torch.manual_seed(self.settings.rollout_seed)
        deterministic = bool(self.cfg.verlflow.deterministic)
        self.logger.set_tags({DETERMINISTIC_TAG: str(deterministic).lower()})
        if deterministic:
            self.determinism_before = make_deterministic(self.settings.rollout_seed)
        elif self.device.type == Device.CPU.torch_type:  # the threads follow the cores other work leaves free
            self.governor = ThreadGovernor(threads)
        model_path = resolve_model_path(self.settings.model_path)
        stopping.stop_point()
        self.tokenizer = load_tokenizer(self.settings.tokenizer_path or model_path, self.settings, self.cfg.resolved)
        self.train_prompts = self._prompts("train")
        self.val_prompts = self._prompts("test")
        self.steps_per_epoch = len(self.train_prompts) // self.settings.train_batch_size
        if self.steps_per_epoch == 0:
            raise VerlflowError(
                f"the train split has {len(self.train_prompts)} usable prompts, fewer than "
                f"data.train_batch_size={self.settings.train_batch_size}: lower it or preprocess more rows"
            )
        self.total_steps = self.settings.total_training_steps or self.steps_per_epoch * self.settings.total_epochs
        stopping.stop_point()
        self.model = load_model(model_path, self.settings, self.device)
        stopping.stop_point()
        self.logger.set_tags({MODEL_PARAMS_TAG: str(sum(p.numel() for p in self.model.parameters()))})
        if self.settings.use_ref:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer, self.scheduler = build_optimizer_and_scheduler(self.model, self.settings, self.total_steps)
        self.reward_fn = reward_fn_from_config(self.cfg.resolved)
        self._resume()

    def _prompts(self, split: str) -> PromptSet:
        from verlflow.data.gsm8k import read_split

        if self.data_dir is not None:
            frame = read_split(self.data_dir, split)
        else:
            frame = _read_parquet(self.settings.train_files if split == "train" else self.settings.val_files, split)
        limit = self.settings.train_max_samples if split == "train" else self.settings.val_max_samples
        if limit and limit > 0:
            frame = frame.head(limit)
        return encode_prompts(
            frame, self.tokenizer, prompt_key=self.settings.prompt_key, reward_fn_key=self.settings.reward_fn_key,
            max_prompt_length=self.settings.max_prompt_length, filter_overlong=self.settings.filter_overlong_prompts,
            truncation=self.settings.truncation, chat_template_kwargs=self.settings.chat_template_kwargs, split=split,
        )

    def _resume(self) -> None:
        """Continue from the newest checkpoint (resume_mode=auto) with its weights, optimizer and RNG."""
        settings = self.settings
        candidates = ckpt.resume_candidates(settings.default_local_dir, settings.resume_mode,
                                            settings.resume_from_path)
        self.logged_through = self.logger.last_step(TIMING_STEP)
        if candidates:
            self._load_checkpoint(candidates)
        if candidates or self.logged_through >= 1:
            self._record_resume_point()

    def _record_resume_point(self) -> None:
        """Log where this attempt continues (``attempt/resumed_from_step``, as the verl backend does) and tag the
        steps the interrupted attempt logged past that point: they are trained again, not logged again."""
        from verlflow.tracking import resume as resuming
        from verlflow.tracking.run_logger import store_errors

        if self.logged_through > self.global_step:
            first, last = self.global_step + 1, self.logged_through
            superseded = str(first) if first == last else f"{first}-{last}"
            self.logger.set_tags({SUPERSEDED_STEPS_TAG: superseded})
            log.warning("steps %s were logged by the interrupted attempt after the checkpoint this one continues from: "
                        "they are trained again and keep their first values in the run (tag %s)", superseded,
                        SUPERSEDED_STEPS_TAG)
        try:
            resuming.log_resumed_from(self.run_id, self.global_step)
        except store_errors() as exc:
            log.warning("attempt/resumed_from_step not logged (tracking store unavailable: %s)", first_line(exc, 200))

    def _load_checkpoint(self, candidates: list[Path]) -> None:
        """Load the newest readable of ``candidates``: weights, optimizer, scheduler, RNG and step."""
        found, state, policy = self._read_checkpoint(candidates)
        self.model.load_state_dict(policy.state_dict())
        del policy
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["lr_scheduler"])
        ckpt.set_rng_state(state["rng"])
        self.global_step = int(state["global_step"])
        self.last_saved = ckpt.hf_dir(found)
        self.logger.set_tags({RESUMED_FROM_TAG: str(Path(found).resolve())})
        origin = state.get("run_id")
        other = f", written by run {origin}" if origin and origin != self.run_id else ""
        print(f"verlflow: resume: run {self.run_id} continues after step {self.global_step} of {self.total_steps} "
              f"(checkpoint {found}{other})", flush=True)

    def _read_checkpoint(self, candidates: list[Path]) -> tuple[Path, dict, Any]:
        """The first of ``candidates`` whose trainer state and model load: (folder, state, model); a newest one
        that cannot be read (truncated by a crash or a full disk) falls back to the one before, saying which."""
        unreadable = []
        for found in candidates:
            try:
                return found, ckpt.load_state(found), load_model(str(ckpt.hf_dir(found)), self.settings, self.device)
            except Exception as exc:  # torch and safetensors raise many kinds for a torn file
                unreadable.append(found)
                log.warning("checkpoint %s cannot be read (%s: %s)%s", found, type(exc).__name__, first_line(exc, 200),
                            f": resuming from {candidates[len(unreadable)]} instead"
                            if len(unreadable) < len(candidates) else "")
        raise VerlflowError(f"no checkpoint under {self.settings.default_local_dir} can be read (tried "
                            f"{', '.join(p.name for p in unreadable)}): start a new run, or give "
                            "trainer.resume_from_path=<a readable global_step_N>")

    # ------------------------------------------------------------------ train

    def train(self, *, on_step_end: StepCallback | None = None, started_at: float) -> TrainResult:
        """Run the remaining steps; validate, sample, checkpoint on schedule; always save the last step."""
        from verlflow.progress import progress_bar

        metrics: dict[str, float] = {}
        if self.settings.val_before_train:
            self._log(self._validate(), self.global_step)
        self.progress = progress_bar(self.total_steps, "GRPO", "step", initial=self.global_step)
        while self.global_step < self.total_steps:
            stopping.stop_point()  # between steps: a stop taken while a step ran ends the run KILLED here
            if self.governor is not None:
                self.governor.adjust()
            self.global_step += 1
            step = self.global_step
            last = step >= self.total_steps
            metrics, samples = self._whole_step(step)
            if self.settings.test_freq > 0 and (last or step % self.settings.test_freq == 0):
                timing: dict[str, float] = {}
                try:
                    with timer("testing", timing):
                        metrics.update(self._validate())
                except KeyboardInterrupt:  # stopped while validating: the step trained, its metrics are kept
                    self._log(metrics, step)
                    raise
                metrics["timing_s/testing"] = timing["testing"]
            self._log(metrics, step)
            if last or (self.settings.test_freq > 0 and step % self.settings.test_freq == 0):
                self._log_samples(samples, step)
            if last or (self.settings.save_freq > 0 and step % self.settings.save_freq == 0):
                self._save()
            self.progress.set_postfix(reward=f"{metrics['critic/score/mean']:.3f}",
                                      step_s=f"{metrics['timing_s/step']:.1f}", refresh=False)
            self.progress.update(1)
            if on_step_end is not None:
                on_step_end(step, metrics)
        if self.last_saved is None or ckpt.checkpoint_step(self.last_saved.parent.parent) != self.global_step:
            self._save()  # resumed at an already finished step: make sure the final checkpoint is there
        final = self.last_saved.resolve()
        summaries = run_record.record_final(self.logger, final, self.global_step, started_at)
        return TrainResult(final_checkpoint=final, steps=self.global_step, run_id=self.run_id,
                           metrics={**metrics, **summaries})

    def _whole_step(self, step: int) -> tuple[dict[str, float], dict[str, list]]:
        """Step ``step`` (profiled when the recipe says so), or none of it: a stop inside it (the rollout's safe points
        come before the update) undoes the step's count and the random draws it made, so the model, optimizer and
        RNG a stop saves are those of the step before, as an uninterrupted run had them."""
        drawn_from = ckpt.rng_state()
        try:
            return self._profiled_step(step) if step in self.cfg.verlflow.profile_steps else self._train_step()
        except KeyboardInterrupt:
            self.global_step = step - 1
            ckpt.set_rng_state(drawn_from)
            raise

    def _train_step(self) -> tuple[dict[str, float], dict[str, list]]:
        """One GRPO step on the next ``train_batch_size`` prompts; returns (metrics, samples)."""
        prompts = self.train_prompts.take(self._batch_rows(self.global_step))
        return grpo_step(self.model, self.ref_model, self.optimizer, self.scheduler, self.tokenizer, prompts,
                         settings=self.settings, reward_fn=self.reward_fn, device=self.device, step=self.global_step)

    def _profiled_step(self, step: int) -> tuple[dict[str, float], dict[str, list]]:
        """:meth:`_train_step` under ``torch.profiler``; its Chrome trace and summary go to ``profile/step_<N>/``."""
        from torch.profiler import ProfilerActivity, profile

        from verlflow.tracking.profiling import summarize_trace

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            result = self._train_step()
        folder = Path(self.settings.default_local_dir).parent / "profile" / f"step_{step}"
        folder.mkdir(parents=True, exist_ok=True)
        trace = folder / "trace.json.gz"  # torch gzips it (a tenth of the size)
        prof.export_chrome_trace(str(trace))
        run_record.log_step_profile(self.logger, step, trace, summarize_trace(trace, PHASES))
        return result

    def _batch_rows(self, step: int) -> list[int]:
        """Prompt rows of a (1-based) step: epoch-seeded shuffles, so a resumed run sees the same order."""
        epoch, position = divmod(step - 1, self.steps_per_epoch)
        count = len(self.train_prompts)
        if self.settings.shuffle:
            order = torch.randperm(count, generator=torch.Generator().manual_seed(self.settings.data_seed + epoch))
        else:
            order = torch.arange(count)
        size = self.settings.train_batch_size
        return order[position * size:(position + 1) * size].tolist()

    def _validate(self) -> dict[str, float]:
        """Score ``val_kwargs`` samples on the val prompts; verl's ``val-core/<source>/reward/mean@N``."""
        return validate(self.model, self.tokenizer, self.val_prompts, settings=self.settings,
                        reward_fn=self.reward_fn, device=self.device)

    # ------------------------------------------------------------------ save / log

    def _save(self) -> None:
        state = {"global_step": self.global_step, "run_id": self.run_id, "optimizer": self.optimizer.state_dict(),
                 "lr_scheduler": self.scheduler.state_dict(), "rng": ckpt.rng_state()}
        self.last_saved = ckpt.save_checkpoint(self.settings.default_local_dir, self.global_step, self.model,
                                               self.tokenizer, state, keep=self.settings.max_ckpt_to_keep)
        if self.global_step < self.total_steps:  # the last one becomes the run's final model, in train()
            self.logger.log_checkpoint_model(self.last_saved.resolve(), self.global_step)

    def keep_on_stop(self) -> None:
        """On a stop: save the last whole step (``global_step``) unless it is saved already, and tell the stop line
        which checkpoint ``--resume`` continues after, or that there is none and why (:func:`stopping.tell_stand`).

        Every recipe, ``save_freq=-1`` included (the smoke recipe): a Ctrl-C at step 15 of 40 keeps step 15. A save
        that fails (a full disk) costs the checkpoint, never the stop; the line says so."""
        step, failed = self.global_step, ""
        saved = ckpt.checkpoint_step(self.last_saved.parent.parent) if self.last_saved is not None else None
        if step > 0 and step != saved and getattr(self, "model", None) is not None:
            try:
                self._save()
            except Exception as exc:  # noqa: BLE001 - the stop goes on; its line names what was lost
                failed = f" (step {step} could not be saved on stop: {first_line(exc, 200)})"
        resume = f"`verlflow train --resume {self.run_id}` (-P resume={self.run_id})"
        newest = ckpt.find_resume_checkpoint(self.settings.default_local_dir, "auto", None)
        total = getattr(self, "total_steps", None)
        if newest is not None:
            of = f" of {total}" if total else ""
            stand = (f"last checkpoint: step {ckpt.checkpoint_step(newest)}{of}, {newest}{failed}; "
                     f"{resume} continues after it")
        elif step == 0:
            stand = f"no checkpoint: it stopped before step 1 ended; {resume} starts it from step 1"
        else:
            stand = f"no checkpoint{failed}: nothing to resume from; start a new run"
        stopping.tell_stand(stand)

    def _log(self, metrics: dict[str, float], step: int) -> None:
        """Log a step's metrics under verl's sanitized names (``mean@1`` → ``mean_at_1``), as verl's logger."""
        from verlflow.tracking.tracking import sanitize_metric_key

        if step <= self.logged_through:
            return  # this run already has this step from before it was interrupted
        self.logger.log_metrics({sanitize_metric_key(k): float(v) for k, v in metrics.items()}, step)

    def _log_samples(self, samples: dict[str, list], step: int) -> None:
        """Log a validation step's sample table; a tracking outage costs the table, never the training."""
        if step <= self.logged_through:
            return
        run_record.log_samples(samples, step, logger=self.logger, traces=self.cfg.verlflow.rollout_traces)

    def cleanup(self) -> None:
        """Flush queued metrics (a failed run keeps every step it logged), close the progress bar and free
        the models (device memory on an accelerator)."""
        self.logger.flush()
        if self.progress is not None:
            self.progress.close()
        self.model = self.ref_model = None
        if self.determinism_before is not None:
            restore_determinism(self.determinism_before)
            self.determinism_before = None
        if getattr(self, "device", None) is not None and self.device.type == "cuda":
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------- helpers


def _read_parquet(path: str | None, split: str):
    import pandas as pd

    if not path or not Path(path).expanduser().is_file():
        key = "data.train_files" if split == "train" else "data.val_files"
        raise VerlflowError(f"no {split} data file '{path}': pass data_dir or set {key} to a parquet file")
    return pd.read_parquet(Path(path).expanduser())
