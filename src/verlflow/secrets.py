"""The one secret filter: every value that leaves the process (store, artifact, console, argv) passes here.

    python -c "from verlflow.secrets import mask_text; print(mask_text('postgresql://bob:pw@db/x?token=abc'))"

A value is a secret when

- its **key names one**: an override, config, parameter or variable key whose last word (split at ``_ -`` and
  camelCase) is password, pass, pw, passphrase, secret, token, bearer, cookie, session, jwt, credential(s),
  auth(orization), or ``key`` after api, hmac, private, access, secret, ssh, … (``trainer.wandb_password``,
  ``dbPassword``, ``aws_secret_access_key``, ``DB_PASS2``; not ``max_token_len`` nor ``prompt_key``); an
  environment variable whose name holds TOKEN, KEY, SECRET, PASSWORD, AUTH, … (:func:`looks_secret`); the same
  rule finds ``key=value`` in free text (a path's ``pass=…``, an exception's message);
- it **carries one**: a URL's ``user:password@``, a query parameter such as ``?token=``, ``?api_key=``,
  ``?session=``, ``?sig=``, ``?X-Amz-Signature=``, ``Bearer …``, a PEM private key block, or a known key
  format (JWTs, AWS access key ids, Hugging Face ``hf_…``, W&B, OpenAI, GitHub, GitLab and Slack tokens);
- it **equals a value marked secret**: the value of a secret-named environment variable, or one
  :func:`remember` was given (the profile's secret environment, secret overrides).

Masked text keeps its shape (``postgresql://***@db/x``, ``token=***``) so a reader still sees what was set.
The real values reach verl through its environment only (:mod:`verlflow.backends.verl.command`); docs/security.md
lists every place the filter is applied.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

MASK = "***"
# An environment variable whose name contains one of these words holds a secret.
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "PWD", "CREDENTIAL", "AUTH",
                "COOKIE", "HEADER", "PRIVATE", "CERT")
# A key names a secret by its last word (``dbPassword``, ``wandb_pass``, ``DB_PASS2``, ``ssh_passphrase``), or
# by ``key`` after a word that makes it one (``hmac_key``, ``api_key``; not ``prompt_key``).
_SECRET_KEY_WORDS = frozenset({"password", "passwd", "pass", "pwd", "pw", "passphrase", "secret", "token", "bearer",
                               "cookie", "session", "jwt", "credential", "credentials", "auth", "authorization",
                               "apikey", "privatekey", "secretkey", "accesskey"})
_KEY_QUALIFIERS = frozenset({"api", "hmac", "private", "access", "secret", "ssh", "signing", "encryption", "master"})
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
# ``key=value`` (or ``key: value``) in free text: an override list, a path, an exception's message.
_ASSIGNMENT = re.compile(r"((?<![\w])([\w.+~/-]+)\s*[=:]\s*)(?!(?:true|false|none|null)\b)(['\"]?)([^\s'\"&,;\]}]+)",
                         re.IGNORECASE)
_URL_USERINFO = re.compile(r"(?<=://)[^/@\s'\"]+@")
# A URL query parameter whose name says it holds a secret (signed URLs: ``sig``, ``X-Amz-Signature``).
_SECRET_QUERY = re.compile(r"([?&;](?:[\w.-]*(?:token|api_?key|apikey|signature|password|passwd|passphrase|secret"
                           r"|credential|session|cookie|bearer|jwt)|sig|key|auth|code|pwd|pw|pass))=([^&#\s'\"]+)",
                           re.IGNORECASE)
_SECRET_QUERY_KEY = re.compile(r"pass(word|wd|phrase)?|pwd|^pw$|secret|token|api_?key|access_?key|credential|signature"
                               r"|session|cookie|bearer|jwt|^sig$", re.IGNORECASE)
# Well-known credential formats: Hugging Face, OpenAI-style, GitHub, GitLab, Slack, AWS access key ids, W&B.
TOKEN_FORMATS = re.compile(r"\b(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_\-]{20,}|gh[pousr]_[A-Za-z0-9]{30,}"
                           r"|github_pat_[A-Za-z0-9_]{30,}|glpat-[A-Za-z0-9_\-]{20,}|xox[abposr]-[A-Za-z0-9\-]{10,}"
                           r"|(?:AKIA|ASIA)[0-9A-Z]{16}|wandb_v1_[A-Za-z0-9_]{20,}|local-[0-9a-f]{40}"
                           r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*)")
# An HTTP credential written out: ``Bearer <token>``, ``Basic <base64>``.
_BEARER = re.compile(r"\b((?:Bearer|Basic)\s+)[A-Za-z0-9._~+/-]{4,}=*")
# A PEM block holding a private key (``-----BEGIN OPENSSH PRIVATE KEY-----`` … ``-----END … -----``), whole.
_PEM_PRIVATE = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
                          re.DOTALL)
# A W&B API key is 40 hex digits: masked where text names W&B next to it (a bare one looks like a git commit).
_WANDB_KEY = re.compile(r"((?:wandb|wb)[\w-]*['\"]?\s*[=:]\s*['\"]?)[0-9a-f]{40}\b", re.IGNORECASE)
# Values shorter than this are not masked by equality (``1``, ``true`` would blank half a report).
MIN_SECRET_LEN = 6
_NOT_SECRET = {"PWD", "OLDPWD"}
_remembered: set[str] = set()


def looks_secret(name: str) -> bool:
    """Whether an environment variable (or any name) ``name`` probably holds a secret: TOKEN, KEY, SECRET, …
    anywhere in it, or a last word that names one as in :func:`key_names_secret` (``DB_PASS2``); the shell's
    working folders ``PWD``/``OLDPWD`` excepted."""
    upper = name.upper()
    return upper not in _NOT_SECRET and (any(word in upper for word in SECRET_WORDS) or key_names_secret(name))


def key_names_secret(key: str) -> bool:
    """Whether a dotted/slashed config, override, param or variable key names a secret, by the words of its last
    segment (split at ``_ -`` and camelCase, numbers dropped): ``trainer.wandb_password``, ``dbPassword``,
    ``ssh_passphrase``, ``hmac_key``, ``session_cookie``, ``DB_PASS2``; not ``max_token_len`` or ``prompt_key``."""
    last = re.split(r"[./]", key.lstrip("+~"))[-1]
    words = [word.lower() for word in _WORD.findall(last) if not word.isdigit()]
    if not words:
        return False
    if words[-1] == "key":
        return len(words) > 1 and words[-2] in _KEY_QUALIFIERS
    return words[-1] in _SECRET_KEY_WORDS or "".join(words[-2:]) in _SECRET_KEY_WORDS


def remember(value: str) -> None:
    """Mark ``value`` secret for the rest of this process: :func:`mask_text` blanks it wherever it appears."""
    if isinstance(value, str) and len(value) >= MIN_SECRET_LEN:
        _remembered.add(value)


def known_values(environ: Mapping[str, str] | None = None) -> set[str]:
    """Values marked secret: remembered ones and those of secret-named environment variables."""
    environ = os.environ if environ is None else environ
    return set(_secret_env_values(frozenset(environ.items()))) | _remembered


@functools.lru_cache(maxsize=16)
def _secret_env_values(environ_items: frozenset[tuple[str, str]]) -> frozenset[str]:
    # Judged once per environment: a config tree is masked value by value, thousands of calls with one environment.
    # A secret-named variable that holds a path (SSL_CERT_FILE, XAUTHORITY) names where a secret is kept: masking
    # that path by value would blank every file name under it.
    return frozenset(v for k, v in environ_items
                     if looks_secret(k) and len(v) >= MIN_SECRET_LEN and not os.path.exists(v))


def mask_text(text: str, *, known: set[str] | None = None) -> str:
    """``text`` with every secret it carries replaced by ``***`` (user parts of URLs, secret query parameters,
    ``secret_key=value`` pairs, known token formats, values marked secret). Other text is left as it was."""
    if not isinstance(text, str) or not text:
        return text
    # By shape first, so a masked URL keeps its host and path; then whatever is left of a known value.
    text = _URL_USERINFO.sub(f"{MASK}@", text)
    text = _SECRET_QUERY.sub(rf"\1={MASK}", text)
    text = _WANDB_KEY.sub(rf"\1{MASK}", text)
    text = _PEM_PRIVATE.sub(MASK, text)
    text = _BEARER.sub(rf"\1{MASK}", text)
    text = TOKEN_FORMATS.sub(MASK, text)
    text = _mask_assignments(text)
    for value in sorted(known if known is not None else known_values(), key=len, reverse=True):
        if value in text:
            text = text.replace(value, MASK)
    return text


def _mask_assignments(text: str) -> str:
    """``text`` with the value of every ``key=value`` whose key names a secret masked; a value under another key is
    read again, as it may hold one itself (``output_dir=/x/pass=…``)."""
    kept, pos = [], 0
    while (match := _ASSIGNMENT.search(text, pos)) is not None:
        head, key, quote, value = match.groups()
        if key_names_secret(key) and value != MASK and value.lower() not in ("bearer", "basic"):  # _BEARER: after
            kept.append(text[pos:match.start()] + head + quote + MASK)
            pos = match.end()
        else:
            kept.append(text[pos:match.start(4)])
            pos = match.start(4)
    return "".join(kept) + text[pos:]


def carries_secret(value: Any) -> bool:
    """Whether a string value holds a secret by its content alone (a URL password, a token, a known value)."""
    return isinstance(value, str) and mask_text(value) != value


def is_secret(key: str, value: Any) -> bool:
    """Whether the setting ``key=value`` is a secret: a non-empty text under a secret key, or one that carries one."""
    if not isinstance(value, str) or not value or value in ("True", "False", "None"):
        return False
    return key_names_secret(key) or carries_secret(value)


def mask_value(key: str, value: Any) -> Any:
    """``value`` fit for a log, given the key it is stored under: ``***`` under a secret key, else filtered."""
    if is_secret(key, value) and key_names_secret(key):
        return MASK
    return mask_text(value) if isinstance(value, str) else value


def mask_env(name: str, value: str) -> str:
    """An environment variable's value fit for a log: hidden when its name looks secret, else filtered."""
    return MASK if looks_secret(name) else mask_text(value)


def mask_tree(tree: Any, key: str = "") -> Any:
    """A config tree (dicts, lists, scalars) with every secret masked; keys are judged by their own name."""
    if isinstance(tree, Mapping):
        return {k: mask_tree(v, f"{key}.{k}" if key else str(k)) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [mask_tree(v, key) for v in tree]
    return mask_value(key, tree)


def mask_url_password(value: str) -> str:
    """``value`` with any URL's ``user:password@`` replaced by ``***@``."""
    return _URL_USERINFO.sub(f"{MASK}@", value)


def _is_path(value: str) -> bool:
    """Whether ``value`` reads as a file path (a leading ``/ ~ ./ ../`` or an existing file)."""
    return value.startswith(("/", "~", "./", "../")) or os.path.isfile(value)


def url_secret(url: str) -> str | None:
    """Where a URL carries a secret, in words (``its user part``, ``query parameter 'sslpassword'``), or None.

    A parameter whose value is a file path (libpq's ``sslkey=/path``) names where a secret is kept, not the
    secret, and is allowed.
    """
    if "://" not in url:
        return None
    parts = urlsplit(url)
    try:
        password = parts.password
    except ValueError:  # an unparsable port: no user part worth reading
        password = None
    if password:  # an empty one (a local socket's trust login) holds nothing secret
        return "a password in its user part (user:password@)"
    for key, value in parse_qsl(parts.query, keep_blank_values=False):
        if _SECRET_QUERY_KEY.search(key) and value and not _is_path(value):
            return f"query parameter '{key}'"
    return None


__all__ = ["MASK", "looks_secret", "key_names_secret", "remember", "known_values", "mask_text", "carries_secret",
           "is_secret", "mask_value", "mask_env", "mask_tree", "mask_url_password", "url_secret"]
