"""Override values that look like credentials: refused, since overrides are logged as run params.

    python -c "import verlflow.config.credentials as c; print(c.credential_problems({'t': 'hf_' + 'a' * 30}))"
"""

from __future__ import annotations

import math
import re
from typing import Any

from verlflow.errors import Problem
from verlflow.util import is_path

_SECRET_KEY = re.compile(r"token|key|secret|pass(word|wd)|credential", re.IGNORECASE)
# Well-known credential formats: Hugging Face, OpenAI-style, GitHub, GitLab, Slack, AWS access key ids.
_TOKEN_FORMATS = re.compile(r"\b(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_\-]{20,}|gh[pousr]_[A-Za-z0-9]{30,}"
                            r"|github_pat_[A-Za-z0-9_]{30,}|glpat-[A-Za-z0-9_\-]{20,}|xox[abposr]-[A-Za-z0-9\-]{10,}"
                            r"|(AKIA|ASIA)[0-9A-Z]{16})\b")


def credential_problems(overrides: dict[str, Any]) -> list[Problem]:
    """Override values that look like credentials: a known token format anywhere, or a long random-looking
    value under a key named like ``*token*``, ``*key*``, ``*secret*``, ``*password*``.

    Overrides are logged as run params (``mlflow run`` logs ``-P overrides`` as given) and printed in the
    launch command, so a credential there leaks into the store.
    """
    problems = []
    for key, value in overrides.items():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if not isinstance(item, str):
                continue
            last = key.rsplit(".", 1)[-1]
            if _TOKEN_FORMATS.search(item) or (_SECRET_KEY.search(last) and _random_looking(item)):
                problems.append(Problem(key, "***", "looks like a credential, and overrides are logged as run "
                                        "params: set it in an environment variable instead (HF_TOKEN, "
                                        "WANDB_API_KEY, … as the library reads it), never in overrides"))
                break
    return problems


def _random_looking(value: str) -> bool:
    """Long, without spaces or path separators, mixing letter cases and digits, with high entropy."""
    if len(value) < 20 or any(c in value for c in " /\\") or is_path(value):
        return False
    classes = sum(any(test(c) for c in value) for test in (str.islower, str.isupper, str.isdigit))
    counts = [value.count(c) for c in set(value)]
    entropy = -sum(n / len(value) * math.log2(n / len(value)) for n in counts)
    return classes >= 2 and entropy >= 3.5
