"""GSM8K → verl's parquet schema, from the hub, a local folder, or a seeded synthetic generator.

    mlflow run . --env-manager local -e preprocess -P source=../shared/data/gsm8k
    python -c "from verlflow.data.gsm8k import preprocess; print(preprocess('synthetic', 'data/gsm8k'))"

One row per problem, exactly as verl's ``examples/data_preprocess/gsm8k.py`` writes it:
``data_source``, ``prompt`` (one user message: question + " " + PROMPT_SUFFIX), ``ability``,
``reward_model`` ({"style": "rule", "ground_truth": "<number>"}) and ``extra_info``
({"split", "index", "answer", "question"}); splits ``train`` and ``test``. Inside an active MLflow
run both splits are logged as dataset inputs, with their row counts and a content digest
(tag ``data.digest``, :mod:`verlflow.data.lineage`) that the registry copies onto model versions for lineage.
"""

from __future__ import annotations

import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from verlflow.data.checks import read_rows
from verlflow.data.lineage import combined_digest, log_split_datasets, rows_digest
from verlflow.data.synthetic import synthetic_examples
from verlflow.errors import VerlflowError
from verlflow.names import DATA_DIGEST_TAG, DATA_DIR_TAG
from verlflow.outage.store_retry import retry_on_lock
from verlflow.util import hub_unreachable, out_of_space_failure

PROMPT_SUFFIX = "Let's think step by step and output the final answer after \"####\"."
# Every row carries this data_source, synthetic ones too: verl picks its GSM8K scorer by it and
# names the validation metric after it (val-core/openai/gsm8k/reward/mean@1).
DATA_SOURCE = "openai/gsm8k"
SPLITS = ("train", "test")
SYNTHETIC = "synthetic"
SYNTHETIC_EASY = "synthetic-easy"  # one-step, single-digit problems (the smoke recipe's: a tiny model learns them)
SYNTHETIC_SIZES = {"train": 512, "test": 128}  # rows per split when source="synthetic" and limit=0
# synthetic-easy: 512 test rows, so that a base-vs-trained accuracy gain of 5 points stands out of the noise.
SYNTHETIC_EASY_SIZES = {"train": 1024, "test": 512}
MLFLOW_CONTEXTS = {"train": "training", "test": "evaluation"}
_NUMBER = re.compile(r"-?[0-9.]+")  # what verl's strict scorer can extract after "#### " (commas removed)
_ALTERNATIVES = ("use a local folder of train/test jsonl or parquet (e.g. -P source=/data/gsm8k), "
                 "-P source=synthetic or synthetic-easy")


@dataclass
class PreprocessResult:
    """Where :func:`preprocess` wrote the splits, how many rows each has, and their content digest."""

    output_dir: Path
    train_path: Path
    test_path: Path
    num_train: int
    num_test: int
    digest: str
    source: str


def extract_ground_truth(answer: str) -> str:
    """The reference number of a GSM8K answer: the text after the last "####", commas removed.

    It must be a number verl's strict scorer can match, or every rollout would score 0 silently.
    """
    if "####" not in answer:
        raise VerlflowError(f"answer has no '####' final-answer marker: {_tail(answer)!r}")
    truth = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not _NUMBER.fullmatch(truth):
        raise VerlflowError(f"text after '####' is not a number: {truth!r} in {_tail(answer)!r}")
    return truth


def to_verl_rows(examples: list[dict], split: str) -> list[dict]:
    """Turn ``{'question', 'answer'}`` examples into verl's GSM8K rows (index = position in the split)."""
    _check_split(split)
    rows = []
    for index, example in enumerate(examples):
        question, answer = example["question"], example["answer"]
        try:
            truth = extract_ground_truth(answer)
        except VerlflowError as exc:
            raise VerlflowError(f"{split} row {index}: {exc}") from None
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": question + " " + PROMPT_SUFFIX}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": truth},
                "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
            }
        )
    return rows


def load_examples(source: str, split: str, limit: int = 0) -> list[dict]:
    """Read one split as ``{'question', 'answer'}`` dicts, validated, the first ``limit`` only if > 0.

    ``source`` is ``openai/gsm8k`` (the hub, config ``main``), a folder holding ``<split>.jsonl`` or
    ``<split>.parquet`` (raw GSM8K, verl-format output, or the hub's ``main/<split>-*.parquet``), or
    ``synthetic`` / ``synthetic:<seed>`` (seed 0 by default; limit=0 means 512 train / 128 test), or
    ``synthetic-easy`` / ``synthetic-easy:<seed>`` (one-step single-digit problems; 1024 train / 512 test).
    """
    _check_split(split)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise VerlflowError(f"limit must be an integer >= 0 (0 = every row), got {limit!r}")
    if source == DATA_SOURCE:
        return _load_hub(split, limit)
    if _is_synthetic(source):
        easy = _synthetic_kind(source) == SYNTHETIC_EASY
        sizes = SYNTHETIC_EASY_SIZES if easy else SYNTHETIC_SIZES
        return synthetic_examples(limit or sizes[split], _synthetic_seed(source), split, easy=easy)
    folder = Path(source).expanduser()
    if folder.is_dir():
        return _load_folder(folder, split, limit)
    if folder.exists():
        raise VerlflowError(f"source '{source}' is a file, not a folder: give the folder that holds it")
    if "/" in source or os.sep in source or source.startswith((".", "~")):
        raise VerlflowError(f"source folder '{source}' does not exist (from {Path.cwd()}): {_ALTERNATIVES}")
    raise VerlflowError(f"unknown source '{source}': use '{DATA_SOURCE}', a local folder, '{SYNTHETIC}' "
                        f"or '{SYNTHETIC_EASY}'")


def preprocess(
    source: str, output_dir: str | Path, limit: int = 0, *, log_to_mlflow: bool = True
) -> PreprocessResult:
    """Write ``output_dir/train.parquet`` and ``test.parquet`` in verl's schema; log them to MLflow.

    ``limit`` > 0 keeps the first rows of each split (synthetic: generates that many per split;
    synthetic with limit=0 gives 512 train / 128 test). Logging happens only when ``log_to_mlflow``
    and an MLflow run is active: both splits as dataset inputs (contexts training / evaluation),
    metrics ``data/<split>/num_rows``, tags ``data.source`` and ``data.digest``.
    """
    # Read both splits before writing anything, so output_dir may be the source folder itself.
    rows = {split: to_verl_rows(load_examples(source, split, limit), split) for split in SPLITS}
    out = Path(output_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    paths, digests = {}, {}
    for split in SPLITS:
        paths[split] = out / f"{split}.parquet"
        tmp = paths[split].with_suffix(f".parquet.{os.getpid()}.tmp")  # two pipelines may write one folder at once
        _write_split(pa.Table.from_pylist(rows[split]), tmp, paths[split])
        digests[split] = rows_digest(rows[split])
    result = PreprocessResult(
        output_dir=out,
        train_path=paths["train"],
        test_path=paths["test"],
        num_train=len(rows["train"]),
        num_test=len(rows["test"]),
        digest=combined_digest(digests),
        source=_canonical_source(source),
    )
    if log_to_mlflow:
        _log_to_mlflow(result, rows, digests)
    return result


def _write_split(table: pa.Table, tmp: Path, path: Path) -> None:
    """Write one split through ``tmp`` (never a half-written split in place); a disk that is full, or a file-size
    limit, is one line naming the folder and its free space, where pyarrow raised ``OSError`` with a traceback."""
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        failure = out_of_space_failure(f"the {path.stem} split", path.parent, exc,
                                       "give an output_dir on a larger disk (-P output_dir=…), then preprocess again")
        if failure is None:
            raise
        raise failure from None


def read_split(data_dir: str | Path, split: str) -> pd.DataFrame:
    """Read a split written by :func:`preprocess` back, nested columns as plain lists and dicts."""
    _check_split(split)
    path = Path(data_dir) / f"{split}.parquet"
    if not path.is_file():
        from verlflow.data.fix_commands import preprocess_command

        if not Path(data_dir).exists():  # most often a typo: preprocessing into it would not be the fix
            raise VerlflowError(f"data folder {data_dir} does not exist: give the folder preprocess wrote (it "
                                f"printed it, and its run's tag {DATA_DIR_TAG} holds it), or write one there: "
                                f"`{preprocess_command('', data_dir)}`")
        raise VerlflowError(f"no {split}.parquet in {data_dir}: run `{preprocess_command('', data_dir)}` first")
    from verlflow.data.checks import check_parquet_split

    check_parquet_split(path)
    return pd.DataFrame(read_rows(path))


# --- local folder -------------------------------------------------------------------------------


def _load_folder(folder: Path, split: str, limit: int) -> list[dict]:
    for directory in (folder, folder / "main"):  # main/: a snapshot of the hub repository
        for pattern in (f"{split}.jsonl", f"{split}.parquet", f"{split}-*.parquet"):
            files = sorted(directory.glob(pattern))
            if files:
                examples: list[dict] = []
                for path in files:
                    reader = _read_jsonl if path.suffix == ".jsonl" else _read_parquet
                    examples += reader(path, limit - len(examples) if limit else 0)
                    if limit and len(examples) >= limit:
                        break
                return examples
    raise VerlflowError(
        f"no {split} data in folder '{folder}': expected {split}.jsonl or {split}.parquet there "
        f"(or the hub's main/{split}-*.parquet)"
    )


def check_text_source(source: str) -> None:
    """Fail in one line when a local source folder's JSON lines are not UTF-8 text.

    Cheap (the files are decoded, not parsed), so the preprocess step asks before it opens a run.
    """
    folder = Path(source).expanduser()
    if not folder.is_dir():
        return
    for path in sorted(folder.glob("*.jsonl")):
        with path.open("rb") as raw:
            try:
                for _ in io.TextIOWrapper(raw, encoding="utf-8"):
                    pass
            except UnicodeDecodeError as exc:
                raise VerlflowError(f"{path} is not UTF-8 text (byte {exc.start} of a line): save it as "
                                    "UTF-8 JSON lines") from None


def _read_jsonl(path: Path, limit: int) -> list[dict]:
    try:
        return _read_jsonl_lines(path, limit)
    except UnicodeDecodeError as exc:
        raise VerlflowError(f"{path} is not UTF-8 text (byte {exc.start} of a line): save it as UTF-8 "
                            "JSON lines") from None


def _read_jsonl_lines(path: Path, limit: int) -> list[dict]:
    examples = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                raise VerlflowError(f"{path} line {number}: not valid JSON ({exc.msg})") from None
            examples.append(_checked(raw, f"{path} line {number}"))
            if limit and len(examples) == limit:
                break
    return examples


def _read_parquet(path: Path, limit: int) -> list[dict]:
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise VerlflowError(f"cannot read {path} as parquet: {exc}") from None
    if limit:
        table = table.slice(0, limit)
    columns = table.column_names
    if "question" in columns and "answer" in columns:
        raws = table.select(["question", "answer"]).to_pylist()
    elif "extra_info" in columns:  # already in verl's schema: the raw text is kept in extra_info
        raws = [dict(info or {}) for info in table.column("extra_info").to_pylist()]
    else:
        raise VerlflowError(f"{path} has no 'question' and 'answer' columns (it has {columns})")
    return [_checked(raw, f"{path} row {index}") for index, raw in enumerate(raws)]


def _checked(raw: object, where: str) -> dict:
    if not isinstance(raw, dict):
        raise VerlflowError(f"{where}: expected an object with 'question' and 'answer', got {type(raw).__name__}")
    for key in ("question", "answer"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise VerlflowError(f"{where}: no '{key}' text (keys: {sorted(raw)})")
    try:
        extract_ground_truth(raw["answer"])
    except VerlflowError as exc:
        raise VerlflowError(f"{where}: {exc}") from None
    return {"question": raw["question"], "answer": raw["answer"]}


# --- the hub ------------------------------------------------------------------------------------


def _load_hub(split: str, limit: int) -> list[dict]:
    import datasets

    # datasets retries an unreachable hub for ~25 s (more where DNS or connects hang): probe first.
    # With HF_HUB_OFFLINE=1 it reads its cache without the network and fails within a second.
    if not datasets.config.HF_HUB_OFFLINE and (problem := _hub_unreachable()):
        raise VerlflowError(
            f"cannot reach the Hugging Face hub ({problem}) to download '{DATA_SOURCE}': {_ALTERNATIVES}, "
            "or set HF_HUB_OFFLINE=1 to use a cached copy"
        )
    try:
        dataset = datasets.load_dataset(DATA_SOURCE, "main", split=split)
    except Exception as exc:  # any failure here means "the hub copy is not available"
        reason = (str(exc).splitlines() or [""])[0]
        raise VerlflowError(
            f"could not load '{DATA_SOURCE}' from the hub ({type(exc).__name__}: {reason}): {_ALTERNATIVES}"
        ) from exc
    if limit:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return [_checked(raw, f"{DATA_SOURCE} {split} row {index}") for index, raw in enumerate(dataset)]


def _hub_unreachable() -> str | None:
    """None when the hub answers for GSM8K in time, else why not (see :func:`verlflow.util.hub_unreachable`)."""
    from huggingface_hub import constants

    return hub_unreachable(f"{constants.ENDPOINT}/api/datasets/{DATA_SOURCE}")


def _synthetic_kind(source: str) -> str:
    """``synthetic`` or ``synthetic-easy`` for a synthetic source (with or without ``:<seed>``), else ''."""
    kind = source.partition(":")[0]
    return kind if kind in (SYNTHETIC, SYNTHETIC_EASY) else ""


def _is_synthetic(source: str) -> bool:
    return bool(_synthetic_kind(source))


def _synthetic_seed(source: str) -> int:
    kind, _, seed = source.partition(":")
    try:
        return int(seed) if seed else 0
    except ValueError:
        raise VerlflowError(f"bad synthetic seed in '{source}': use '{kind}' or '{kind}:<int>'") from None


# --- shared helpers -----------------------------------------------------------------------------


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise VerlflowError(f"unknown split '{split}': use one of {', '.join(SPLITS)}")


def _tail(text: str, width: int = 60) -> str:
    return text if len(text) <= width else "…" + text[-width:]


def _canonical_source(source: str) -> str:
    if source == DATA_SOURCE:
        return source
    if _is_synthetic(source):
        return f"{_synthetic_kind(source)}:{_synthetic_seed(source)}"
    return str(Path(source).expanduser().resolve())


def default_output_dir(source: str) -> Path:
    """``data/<source>``: where ``main`` and ``preprocess`` put a source's splits (``/`` and the like → ``-``)."""
    slug = re.sub(r"[^A-Za-z0-9._]+", "-", source).strip("-.") or "data"
    return Path("data") / slug


def data_dir_digest(data_dir: str | Path) -> str | None:
    """The ``data.digest`` of a folder :func:`preprocess` wrote (None when it holds no such files).

    Train runs carry it as a tag, so a registered model names the exact data it was trained on even
    when its preprocess run is in another store.
    """
    paths = {split: Path(data_dir) / f"{split}.parquet" for split in SPLITS}
    if not all(p.is_file() for p in paths.values()):
        return None
    digests = {split: rows_digest(read_rows(path)) for split, path in paths.items()}
    return combined_digest(digests)


def _log_to_mlflow(result: PreprocessResult, rows: dict[str, list[dict]], digests: dict[str, str]) -> None:
    from verlflow.tracking import writes

    paths = {"train": result.train_path, "test": result.test_path}
    if not log_split_datasets(rows, paths, digests, {split: MLFLOW_CONTEXTS[split] for split in SPLITS}):
        return
    retry_on_lock(writes.log_metrics, {"data/train/num_rows": result.num_train, "data/test/num_rows": result.num_test})
    retry_on_lock(writes.set_tags, {"data.source": result.source, DATA_DIGEST_TAG: result.digest})
