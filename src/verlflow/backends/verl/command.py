"""A composed config → the exact verl launch: dotted overrides, environment, and the bash script that runs it.

    python -c "from verlflow.backends.verl.command import demo; print(demo('a3'))"

Nothing here starts a process. :func:`build_plan` takes the recipe + profile + overrides composed by
:mod:`verlflow.config`, adds the keys every verlflow launch forces (:mod:`.forced`; each says why in
:attr:`LaunchPlan.notes`), and splits the secrets out: a secret reaches verl through its environment only.

The profile's files are sourced and its libraries preloaded *by the script, where they exist* (the
guide's ``if [ -f …libjemalloc.so.2 ]``), so one script is right on the machine that runs it — this one
or a Ray cluster's head node. The launch module is ``verl.trainer.main_ppo`` unless the recipe's
``verlflow.launch_module`` names another module or a ``.py`` file (tests put a stand-in there).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from verlflow import config, known_warnings, secrets
from verlflow.backends.verl.forced import absolute_path, forced_overrides, traced_samples
from verlflow.config import VerlflowBlock
from verlflow.errors import VerlflowError

DEFAULT_LAUNCH_MODULE = VerlflowBlock.launch_module
# Where per-run folders go unless the recipe's ``verlflow.output_dir`` says otherwise (relative to the cwd).
DEFAULT_OUTPUT_ROOT = "outputs/verl"
# The guide's console lines (§5.2) around the jemalloc preload.
JEMALLOC_ENABLED_LINE = "jemalloc enabled"
JEMALLOC_MISSING_LINE = "Running without jemalloc - consider installing it for better performance: " \
    "sudo apt-get install libjemalloc2"
# Printed just before verl starts; what precedes it is the sourced files' own output.
LAUNCH_MARKER = "verlflow: launching verl"
# Printed on stdout right before exec when asked: verl's ``--cfg job`` output follows it.
STDOUT_MARKER = "--- verlflow: verl output follows ---"


@dataclass
class LaunchPlan:
    """Everything one verl launch is: command line, environment, folders. Built by :func:`build_plan`."""

    # Module run with ``python -m`` (verl.trainer.main_ppo) or a .py file run as a script.
    launch_module: str
    # Dotted verl keys → values, as the command line gives them (recipe < profile < overrides < forced).
    overrides: dict[str, Any]
    # Exported by the script after the profile files are sourced (profile env, TENSORBOARD_DIR, …).
    env: dict[str, str]
    # Given to the launched process and, for Ray jobs, to every worker: MLFLOW_RUN_ID, MLFLOW_TRACKING_URI.
    attach_env: dict[str, str]
    source_files: list[str]
    preload: list[str]
    # <output root>/<run id>: the process's working directory; holds checkpoints/, hf/, tensorboard/.
    run_dir: Path
    checkpoint_dir: str
    hf_dir: Path
    # The python that runs verl: this interpreter for local launches, ``python3`` on a Ray cluster.
    python: str = field(default_factory=lambda: sys.executable)
    # One line per forced change, for the console and command.txt.
    notes: list[str] = field(default_factory=list)
    # Secrets: given to the launched process in its environment only, never written into the script or argv
    # (the profile's secret variables, and VERLFLOW_SECRET_<n> for each override that holds one).
    secret_env: dict[str, str] = field(default_factory=dict)
    # Override key → the VERLFLOW_SECRET_<n> variable verl reads its value from (``${oc.env:…}`` on the command line).
    secret_refs: dict[str, str] = field(default_factory=dict)

    @property
    def loggers(self) -> list[str]:
        """verl's ``trainer.logger`` list as launched."""
        return list(self.overrides["trainer.logger"])

    def argv(self, *extra: str) -> list[str]:
        """The launch command as an argument list (python, module or script, Hydra overrides)."""
        target = ["-m", self.launch_module] if not self.launch_module.endswith(".py") else [self.launch_module]
        return [self.python, *target, *config.hydra_overrides(self.argv_overrides()), *extra]

    def argv_overrides(self) -> dict[str, Any]:
        """The overrides as the command line carries them: a secret value replaced by ``${oc.env:<its variable>}``."""
        return {**self.overrides, **{key: f"${{oc.env:{name}}}" for key, name in self.secret_refs.items()}}

    def validation_argv(self) -> list[str]:
        """verl's own composition of these overrides: ``main_ppo --cfg job`` prints the job config and exits."""
        return [self.python, "-m", DEFAULT_LAUNCH_MODULE, *config.hydra_overrides(self.argv_overrides()),
                "--cfg", "job"]

    def script(self, argv: list[str] | None = None, *, stdout_marker: bool = False, chdir: bool = False,
               prelude: Sequence[str] = ()) -> str:
        """The bash script that sources, exports, preloads and then ``exec``s ``argv`` (default: the launch).

        ``stdout_marker`` also prints :data:`STDOUT_MARKER` on stdout before ``exec``, so what the sourced
        files print can be told apart from what verl prints. ``chdir`` first makes and enters the run folder
        (a Ray job's entrypoint starts in Ray's working directory, a local launch is started in it).
        ``prelude``: shell lines run in the prepared environment just before verl starts (a Ray job's
        resume point and node samplers, :func:`verlflow.backends.verl.launch.ray_job_spec`).
        """
        lines = []
        if chdir:
            folder = shlex.quote(str(self.run_dir))
            lines.append(f"mkdir -p {folder} && cd {folder} || exit 1")
        for path in self.source_files:
            q = shlex.quote(path)
            missing = shlex.quote(f"verlflow: {path} not found, not sourced")
            lines.append(f"if [ -f {q} ]; then source {q}; else echo {missing} >&2; fi")
        lines += [f"export {name}={shlex.quote(value)}" for name, value in self.env.items()]
        for lib in self.preload:
            q = shlex.quote(lib)
            on, off = ((JEMALLOC_ENABLED_LINE, JEMALLOC_MISSING_LINE) if is_jemalloc(lib)
                       else (f"verlflow: preloading {lib}", f"verlflow: {lib} not found, not preloaded"))
            lines += [
                f"if [ -f {q} ]; then",
                f'  export LD_PRELOAD={q}"${{LD_PRELOAD:+:$LD_PRELOAD}}"',
                f"  echo {shlex.quote(on)} >&2",
                "else",
                f"  echo {shlex.quote(off)} >&2",
                "fi",
            ]
        lines += list(prelude)
        lines.append(f"echo {shlex.quote(LAUNCH_MARKER)} >&2")
        if stdout_marker:
            lines.append(f"echo {shlex.quote(STDOUT_MARKER)}")
        words = [shell_quote(a) for a in (argv or self.argv())]
        head = 3 if len(words) > 2 and words[1] == "-m" else 2
        lines.append("exec " + " \\\n  ".join([" ".join(words[:head]), *words[head:]]))
        return "\n".join(lines) + "\n"

    def command_text(self, *, ray_command: str | None = None) -> str:
        """``config/command.txt``: what runs, exactly, with the environment we set (secrets masked: their
        values are in the launched process's environment only, named here as ``***``)."""
        head = [
            "# verl launch by verlflow. Environment set for the process (and every Ray worker):",
            *(f"export {k}={shlex.quote(secrets.mask_env(k, v))}" for k, v in self.attach_env.items()),
            *(f"export {k}={secrets.MASK}  # secret: in the process environment only" for k in self.secret_env),
            f"cd {shlex.quote(str(self.run_dir))}",
        ]
        if self.notes:
            head += ["# forced by verlflow:", *(f"#   {secrets.mask_text(n)}" for n in self.notes)]
        body = self.script()
        if ray_command:
            body = f"# submitted as a Ray job:\n{ray_command}\n# whose entrypoint runs:\n{body}"
        return "\n".join(head) + "\n" + body


def shell_quote(word: str) -> str:
    """``word`` quoted for bash, readably: ``"k=['a','b']"`` rather than shlex's ``'k=['"'"'a'"'"…``."""
    if "'" in word and not re.search(r'["$`\\!]', word):
        return f'"{word}"'
    return shlex.quote(word)


def is_jemalloc(path: str) -> bool:
    """Whether a preload library is jemalloc (the guide's optional allocator)."""
    return "jemalloc" in Path(path).name


def missing_preloads(plan: LaunchPlan) -> list[str]:
    """The profile's preload libraries that are absent on *this* machine."""
    return [lib for lib in plan.preload if not Path(lib).is_file()]



def absolute_tracking_uri(uri: str) -> str:
    """A tracking URI that means the same store from any working directory.

    ``sqlite:///mlflow.db`` (relative to the cwd) → ``sqlite:////abs/mlflow.db``; a bare path or a relative
    ``file:`` URI → ``file:///abs/…``; server URIs (http, https, databricks, …) unchanged.
    """
    if uri.startswith("sqlite:///"):
        rest = uri.removeprefix("sqlite:///")
        path, sep, query = rest.partition("?")
        if path and not path.startswith("/") and path != ":memory:":
            return f"sqlite:///{Path(path).resolve()}{sep}{query}"
        return uri
    parts = urlsplit(uri)
    if parts.scheme == "file":
        path = parts.netloc + parts.path if parts.netloc not in ("", "localhost") else parts.path
        return urlunsplit(("file", "", str(Path(path).resolve()), "", "")) if not path.startswith("/") else uri
    if parts.scheme == "" or (len(parts.scheme) == 1 and uri[1:3] in (":\\", ":/")):
        return Path(uri).resolve().as_uri()
    return uri


def launch_module_of(block: dict[str, Any]) -> str:
    """The recipe's ``verlflow.launch_module``: a module name, or a ``.py`` file (made absolute)."""
    module = str(block.get("launch_module") or DEFAULT_LAUNCH_MODULE)
    if module.endswith(".py"):
        path = Path(module).expanduser().resolve()
        if not path.is_file():
            raise VerlflowError(f"verlflow.launch_module '{module}' is not a file: give a module name "
                                f"(default {DEFAULT_LAUNCH_MODULE}) or an existing .py file")
        return str(path)
    if not re.fullmatch(r"[A-Za-z_][\w.]*", module):
        raise VerlflowError(f"verlflow.launch_module '{module}' is neither a module name nor a .py file")
    return module


def run_dir_of(cfg: config.ComposedConfig, run_id: str) -> Path:
    """``<verlflow.output_dir>/<run id>``: the run's folder, the launch's working directory."""
    return Path(str(cfg.verlflow.output_dir or DEFAULT_OUTPUT_ROOT)).expanduser().resolve() / run_id


def checkpoint_dir_of(cfg: config.ComposedConfig, run_id: str) -> str:
    """Where verl saves the run's checkpoints: the overrides' ``trainer.default_local_dir``, else the run folder's."""
    given = cfg.overrides.get("trainer.default_local_dir")
    return str(absolute_path(given)) if given else str(run_dir_of(cfg, run_id) / "checkpoints")


def build_plan(
    cfg: config.ComposedConfig,
    *,
    run_id: str,
    experiment_name: str,
    run_name: str,
    tracking_uri: str,
) -> LaunchPlan:
    """The launch of ``cfg`` for the MLflow run ``run_id``: forced overrides, env and folders (nothing runs)."""
    run_dir = run_dir_of(cfg, run_id)
    overrides, notes = forced_overrides(cfg.overrides, project=experiment_name, experiment=run_name or run_id,
                                        run_dir=run_dir, traces=traced_samples(cfg.verlflow),
                                        profile_steps=tuple(cfg.verlflow.profile_steps),
                                        device=str(cfg.profile.device),
                                        deterministic=bool(cfg.verlflow.deterministic))
    env, secret_env = split_secret_env(cfg.profile.env)
    secret_refs = {}
    for key, value in overrides.items():
        if secrets.is_secret(key, value):
            name = f"{SECRET_VARIABLE}{len(secret_refs)}"
            secret_refs[key], secret_env[name] = name, value
    for value in secret_env.values():
        secrets.remember(value)  # the launch's output is filtered for it too (verl prints its resolved config)
    if secret_refs:  # verl logs its resolved config as params: the guard masks them inside verl's processes
        loaded = [m for m in env.get(EXTERNAL_MODULES, "").split(",") if m]
        env[EXTERNAL_MODULES] = ",".join([*loaded, SECRET_GUARD_MODULE])
    if "tensorboard" in overrides["trainer.logger"]:
        env.setdefault("TENSORBOARD_DIR", str(run_dir / "tensorboard"))
    # Lines reach the console and logs/verl.log as they are printed, not when a buffer fills.
    env.setdefault("PYTHONUNBUFFERED", "1")
    # verl's repeated, harmless warnings, dropped in its processes and Ray workers (each with its reason there).
    env.setdefault("PYTHONWARNINGS", known_warnings.python_warnings(os.environ.get("PYTHONWARNINGS", "")))
    attach = {"MLFLOW_RUN_ID": run_id, "MLFLOW_TRACKING_URI": absolute_tracking_uri(tracking_uri),
              # verlflow samples system/* itself (verlflow.device.system_metrics); a second sampler in verl's
              # process would log the same keys at clashing steps.
              "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING": "false"}
    if attach["MLFLOW_TRACKING_URI"].startswith(("http://", "https://")):
        from verlflow.outage.metric_buffer import VERL_HTTP_KNOBS

        # verl's own MLflow logger rides out a server outage of minutes instead of failing the step.
        attach.update({k: os.environ.get(k, v) for k, v in VERL_HTTP_KNOBS.items()})
    return LaunchPlan(
        launch_module=launch_module_of(cfg.verlflow),
        overrides=overrides,
        env=env,
        attach_env=attach,
        source_files=list(cfg.profile.source_files),
        preload=list(cfg.profile.preload),
        run_dir=run_dir,
        checkpoint_dir=str(overrides["trainer.default_local_dir"]),
        hf_dir=run_dir / "hf",
        notes=notes,
        secret_env=secret_env,
        secret_refs=secret_refs,
    )


# What a secret override's value is passed to verl in (``${oc.env:VERLFLOW_SECRET_0}`` on its command line).
SECRET_VARIABLE = "VERLFLOW_SECRET_"
# verl (>= 0.9) imports the modules named here in its driver and every Ray worker.
EXTERNAL_MODULES = "VERL_USE_EXTERNAL_MODULES"
SECRET_GUARD_MODULE = "verlflow.backends.verl.secret_guard"
# An environment variable name bash can export.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def split_secret_env(env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The profile's environment as (exported by the script, secret: given in the process environment only).

    A name bash cannot export is refused in one line (it would be spliced into the script).
    """
    bad = [name for name in env if not ENV_NAME.fullmatch(name)]
    if bad:
        raise VerlflowError(f"profile.env name {bad[0]!r} is not an environment variable name: letters, digits "
                            "and _ only, not starting with a digit")
    secret = {k: str(v) for k, v in env.items() if secrets.looks_secret(k) or secrets.carries_secret(str(v))}
    return {k: str(v) for k, v in env.items() if k not in secret}, secret


def demo(profile: str = "a3") -> str:
    """command.txt of the guide's recipe on ``profile`` for a made-up run (for a quick look)."""
    cfg = config.compose("qwen3-4b-gsm8k-grpo", profile)
    plan = build_plan(cfg, run_id="0123456789abcdef", experiment_name="Default", run_name="demo",
                      tracking_uri=os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db"))
    return plan.command_text()
