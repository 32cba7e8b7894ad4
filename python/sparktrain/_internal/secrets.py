"""Secrets never reach the store, MLflow, logs or printed reports.

Three rules.  :func:`mask_secrets` applies them to a flat ``{dotted key:
value}`` config, :func:`mask_config` to a nested one (``cfg.to_dict()``),
:func:`mask_strings` to any JSON-like body, and :func:`mask_value` to any
string sparktrain logs or records (a master URL, a tracking URI, an error
message, a traceback).  :class:`~sparktrain._internal.log_masking.SecretFilter`
applies :func:`mask_value` to log records; the CLI installs it.

By key: :func:`is_secret_key`
-----------------------------
A key (``a.b.c``, ``AWS_SECRET_ACCESS_KEY``, ``apiToken``) is split into
words at ``.``, ``_``, ``-``, ``/``, spaces and camelCase boundaries,
lower-cased.  It names a secret when a word

* contains ``password``, ``passwd``, ``passphrase``, ``secret``,
  ``credential`` or ``signature``;
* is ``token`` or ends in ``token`` (``accessToken``, ``HF_TOKEN``), but not
  ``tokens``, ``tokenizer`` or ``max_tokens``;
* is ``key``/``keys`` or ends in ``key`` (``apikey``, ``accessKey``,
  ``fs.s3a.secret.key``);
* is ``sas`` (Azure SAS tokens: ``fs.azure.sas.<container>.<account>...``)
  or ``sig``;

or when its *last* word is ``auth`` or ``pat`` (``tracking.auth``,
``GITHUB_PAT``; not ``author``, ``path`` or ``pattern``).

Every word of the key counts, not only the last segment: Hadoop names
credentials in the middle of a key (``fs.azure.account.key.<account>.dfs.core.windows.net``,
``fs.azure.sas.<container>.<account>.blob.core.windows.net``).  Two
exceptions keep column names readable, because by the config schema they are
never credentials and masking them would make a run irreproducible:

* ``data.key`` (exactly that key) is the column the split hashes;
* the segment after ``features.`` is a feature's (column) name, so it is not
  matched; the setting names under it are (``features.x.api_key`` is masked).

Keys such as ``spark.conf.spark.sql.shuffle.partitions``, ``train.store`` or
``tracking.uri`` stay readable.  Over-masking is preferred to under-masking:
``features.x.monkey`` or ``spark.conf.spark.ssl.keyStore`` (a path) are masked.

By value: :func:`mask_value`
----------------------------
Whatever the key, in a string value

* a URL's password: ``scheme://user:pa/ss@host`` -> ``scheme://user:***@host``
  (everything between ``user:`` and the last ``@`` before a space: a
  password with ``/``, ``:`` or an unencoded ``@`` is masked whole);
* an Azure SAS query string, recognised by its signature ``sig=``:
  ``https://acct.blob.core.windows.net/c?sv=...&se=...&sig=...`` ->
  ``https://acct.blob.core.windows.net/c?***`` (a bare ``sv=...&sig=...`` -> ``***``);
* an assignment ``name=value``, ``"name": "value"``, ``'name': value`` or
  ``name: value`` at the start of a line (YAML), whose name is secret:

  - at the start of the value, after ``?``, ``&`` or ``;``, or as a Java
    option ``-Dname=value``, by the key rule above, or when the name is
    ``pwd`` or ``auth`` (Spark Connect URLs ``sc://host:15002/;token=abc``,
    ``?token=``/``&access_token=`` query strings, ODBC ``Pwd=``,
    ``-Dfs.s3a.secret.key=...``);
  - anywhere else (after a space, a quote, ``(``, ``,``: prose, JSON, a
    Python ``repr``, a log line) by the key rule without a bare ``key``:
    ``password=...``, ``AWS_SECRET_ACCESS_KEY=...``, ``api_key=...``,
    ``"password": "..."`` are masked, ``use KEY=VALUE`` and
    ``WHERE key=1`` stay.  ``key`` counts there only after a qualifier
    (``api``, ``access``, ``secret``, ``private``, ``account``...);

  a quoted value is masked up to its closing quote, a bare one up to the
  next space, ``&``, ``;`` or quote;
* HTTP credentials: ``Authorization: <scheme> <credentials>``,
  ``Bearer <token>`` (a token of 8 or more characters with a digit or
  punctuation, so "bearer of bad news" stays) and ``Basic <base64 of user:password>``;
* well-known token formats, whatever surrounds them: PEM private keys,
  JWTs, GitHub (``ghp_``, ``github_pat_``), Databricks (``dapi``), Hugging
  Face (``hf_``) and Slack (``xox?-``) tokens, AWS access key ids, Google
  API keys;
* any value this process knows to be a secret (:func:`known_secrets`): the
  values of environment variables with a secret name (by the key rule
  without a bare ``key``; ``MLFLOW_TRACKING_PASSWORD``,
  ``AWS_SECRET_ACCESS_KEY``...) and those :func:`remember` was given (the
  secret values of every job config parsed in this process), when at least
  :data:`MIN_KNOWN` characters long.  This catches a secret quoted without
  any name, e.g. by a library's error message.

What masking cannot undo
------------------------
A masked value is gone: what reads a masked record back must take the
secret from where it lives (the environment, the config it is given), never
from the record.  ``sparktrain register --from-store`` does so for the
tracking URI (:mod:`sparktrain.track.bundle`).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import threading
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Set

MASK = "***"
#: Keys whose value is a column name by the config schema (see the module docstring).
NOT_SECRET = frozenset({"data.key"})
#: Shortest value :func:`mask_value` masks wherever it appears (shorter ones would mask ordinary words).
MIN_KNOWN = 6
_SECRET_PARTS = ("password", "passwd", "passphrase", "secret", "credential", "signature")
_LAST_WORDS = frozenset({"auth", "pat"})
#: Words that make a following ``key`` a credential in prose (``api key``, ``access_key``, ``accountKey``).
_KEY_QUALIFIERS = frozenset({"api", "access", "secret", "private", "account", "client", "master", "shared",
                             "signing", "encryption", "session", "storage", "subscription", "auth", "ssh",
                             "license", "app", "service", "consumer", "admin", "root", "sas"})
#: Parameter names that are secret inside a value although the key rule does not match them.
_SECRET_PARAMS = frozenset({"pwd", "auth"})
_WORD_SPLIT = re.compile(r"[._\-/\s]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_URL_PASSWORD = re.compile(r"(?P<scheme>\b[a-zA-Z][\w+.\-]*://)(?P<user>[^:/@\s]*):(?P<pw>\S*)@")
_ASSIGN = re.compile(r"(?P<lead>\A|[?&;\s,({\[])(?P<opt>-D)?(?P<q>[\"']?)(?P<name>[A-Za-z_][\w.\-]*)(?P=q)"
                     r"(?P<sep>[ \t]*[:=][ \t]*)")
_ASSIGNED = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'|[^\s&;\"']*")
_SAS = re.compile(r"(?:^|[?&;])sig=", re.IGNORECASE)
_AUTHORIZATION = re.compile(
    r"(?i)\b(?P<head>(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)(?:(?P<scheme>basic|bearer|token|digest|"
    r"negotiate|ntlm|aws4-hmac-sha256|apikey|sharedkey)\s+)?(?P<cred>[^\s\"']+)")
_BEARER = re.compile(r"(?i)\b(?P<scheme>bearer)\s+(?P<cred>(?=[\w\-.~+/]*[\d\-.~+/_])[\w\-.~+/]{8,}=*)")
_BASIC = re.compile(r"(?i)\b(?P<scheme>basic)\s+(?P<cred>[A-Za-z0-9+/]{4,}={0,2})(?![\w+/=])")
_TOKEN_FORMATS = re.compile(
    r"-----BEGIN (?P<pem>[A-Z0-9 ]*PRIVATE KEY)-----.*?-----END [A-Z0-9 ]*PRIVATE KEY-----"
    r"|\beyJ[\w-]{6,}\.[\w-]{6,}\.[\w-]{6,}"                   # JWT
    r"|\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{30,})"    # GitHub
    r"|\bdapi[0-9a-f]{32}(?:-\d+)?\b"                          # Databricks
    r"|\bhf_[A-Za-z0-9]{30,}"                                  # Hugging Face
    r"|\bxox[abprs]-[\w-]{10,}"                                # Slack
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"                          # AWS access key id
    r"|\bAIza[\w-]{35}\b",                                     # Google API key
    re.DOTALL)

#: Substrings without which no token format can match (a cheap test before the regular expression).
_FORMAT_MARKERS = ("-----BEGIN ", "eyJ", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "dapi", "hf_", "xox",
                   "AKIA", "ASIA", "AIza")

_remembered: Set[str] = set()
_remembered_lock = threading.Lock()
_env_cache: Dict[FrozenSet[Any], FrozenSet[str]] = {}


def _words(key: str) -> List[str]:
    out: List[str] = []
    for part in _WORD_SPLIT.split(key):
        out += [w.lower() for w in _CAMEL.split(part) if w]
    return out


def _names_secret(words: List[str], prose: bool = False) -> bool:
    """The key rule on a key's words; ``prose``: a bare ``key`` counts only after a qualifier."""
    for i, word in enumerate(words):
        if any(p in word for p in _SECRET_PARTS) or word.endswith("token"):
            return True
        if not prose and (word in ("sas", "sig", "keys") or word.endswith("key")):
            return True
        if prose and (word in ("key", "keys") or word.endswith("key")):
            stem = word[:-1] if word.endswith("keys") else word
            if stem[:-3] in _KEY_QUALIFIERS or (i > 0 and words[i - 1] in _KEY_QUALIFIERS):
                return True
    return bool(words) and words[-1] in _LAST_WORDS


def is_secret_key(key: str) -> bool:
    """Whether the dotted config ``key`` names a secret (the key rule of the module docstring).

    Examples
    --------
    >>> is_secret_key("spark.conf.spark.hadoop.fs.s3a.secret.key"), is_secret_key("data.key")
    (True, False)
    >>> is_secret_key("tracking.apiToken"), is_secret_key("features.monkey_key.type")
    (True, False)
    >>> is_secret_key("features.text.max_tokens"), is_secret_key("GITHUB_PAT"), is_secret_key("pattern")
    (False, True, False)
    """
    if key in NOT_SECRET:
        return False
    parts = key.split(".")
    if parts[0] == "features" and len(parts) > 2:  # features.<column name>.<setting>
        parts = [parts[0], *parts[2:]]
    return _names_secret(_words(".".join(parts)))


def _is_secret_name(name: str, prose: bool) -> bool:
    return (not prose and name.lower() in _SECRET_PARAMS) or _names_secret(_words(name), prose)


# ------------------------------------------------------------------------------------------------ by value

def _mask_sas(token: str) -> str:
    if not _SAS.search(token):
        return token
    if "?" in token:
        return token[:token.index("?") + 1] + MASK
    return MASK


def _masked_assignment(m: "re.Match[str]", value: str) -> "str | None":
    """The assignment ``m`` (up to its separator) followed by ``value``, masked; None when it is no secret."""
    lead, opt, quote, name, sep = m["lead"], m["opt"] or "", m["q"], m["name"], m["sep"]
    strict = lead in ("", "?", "&", ";") or bool(opt)     # a parameter: the start of a value, a URL, -D
    if ":" in sep or sep != sep.strip():                   # `name: v`, `name = v`: JSON, YAML, repr only
        line_start = m.string.rfind("\n", 0, m.start("name")) + 1
        yaml = not m.string[line_start:m.start("name") - len(quote) - len(opt)].strip()
        if not quote and not yaml:
            return None
    if not value or value.strip("\"'") in (MASK, "", "null", "None", "true", "false") \
            or not _is_secret_name(name, prose=not strict):
        return None
    masked = f"{value[0]}{MASK}{value[0]}" if value[0] in "\"'" else MASK
    return f"{lead}{opt}{quote}{name}{quote}{sep}{masked}"


def _bare_end(value: str) -> str:
    """``value`` without the punctuation that closes the text around it: ``(token=abc)``, ``key=abc.``."""
    if value[:1] in "\"'":
        return value
    while value and (value[-1] in ",.:" or (value[-1] in ")]}" and
                                              value.count(value[-1]) > value.count("([{"[")]}".index(value[-1])]))):
        value = value[:-1]
    return value


def _mask_assignments(text: str) -> str:
    out: List[str] = []
    pos = done = 0
    while True:
        m = _ASSIGN.search(text, pos)
        if m is None:
            return "".join(out) + text[done:]
        found = _ASSIGNED.match(text, m.end())  # it matches the empty string too: never None
        value = _bare_end(found.group(0) if found else "")
        end = m.end() + len(value)
        masked = _masked_assignment(m, value)
        if masked is None:  # not a secret: scan on from the separator (the value may hold `?token=...`)
            pos = m.end("name")
            continue
        out += [text[done:m.start()], masked]
        pos = done = end


def _mask_basic(m: "re.Match[str]") -> str:
    try:
        decoded = base64.b64decode(m["cred"], validate=True)
    except (binascii.Error, ValueError):
        return m.group(0)
    return f"{m['scheme']} {MASK}" if b":" in decoded else m.group(0)


def _mask_authorization(m: "re.Match[str]") -> str:
    if m["cred"] == MASK:
        return m.group(0)
    return f"{m['head']}{m['scheme'] + ' ' if m['scheme'] else ''}{MASK}"


def _mask_format(m: "re.Match[str]") -> str:
    if m["pem"]:
        return f"-----BEGIN {m['pem']}-----{MASK}-----END {m['pem']}-----"
    return MASK


def known_secrets() -> FrozenSet[str]:
    """Values masked wherever they appear: secret-named environment variables and :func:`remember`'s."""
    items = frozenset(os.environ.items())
    env = _env_cache.get(items)
    if env is None:  # the environment changed (or this is the first call): one entry, recomputed
        env = frozenset(v for k, v in items if len(v) >= MIN_KNOWN and _names_secret(_words(k), prose=True))
        _env_cache.clear()
        _env_cache[items] = env
    with _remembered_lock:
        return env | _remembered


def remember(values: Iterable[Any]) -> None:
    """Mask these values (strings of :data:`MIN_KNOWN` or more characters) in every later :func:`mask_value`."""
    found = {v for v in values if isinstance(v, str) and len(v) >= MIN_KNOWN and v != MASK}
    if found:
        with _remembered_lock:
            _remembered.update(found)


def secrets_of(flat: Mapping[str, Any]) -> List[str]:
    """The secret values of a flat config: values of secret keys, and the passwords of URLs in any value."""
    out: List[str] = []
    for k, v in flat.items():
        if v is None:
            continue
        if is_secret_key(k):
            out.append(str(v))
        elif isinstance(v, str):
            out += [m["pw"] for m in _URL_PASSWORD.finditer(v) if m["pw"]]
    return out


def mask_value(value: str) -> str:
    """``value`` with every secret the value rules of the module docstring find replaced by ``***``.

    Examples
    --------
    >>> mask_value("sc://spark.example.com:15002/;user_id=ana;token=abc123")
    'sc://spark.example.com:15002/;user_id=ana;token=***'
    >>> mask_value("https://bob:pa/ss@mlflow.example.com")
    'https://bob:***@mlflow.example.com'
    >>> mask_value("https://acct.blob.core.windows.net/c?sv=2022-11-02&se=2026-01-01&sig=Zm9v%3D")
    'https://acct.blob.core.windows.net/c?***'
    >>> mask_value('connect user=ana password=hunter2 {"api_key": "k-123"}')
    'connect user=ana password=*** {"api_key": "***"}'
    """
    return _mask(value, _longest_first(known_secrets())) if value else value


def _longest_first(known: FrozenSet[str]) -> List[str]:
    return sorted(known, key=len, reverse=True)


def _mask(text: str, known: List[str]) -> str:
    for secret in known:
        if secret in text:
            text = text.replace(secret, MASK)
    if any(marker in text for marker in _FORMAT_MARKERS):
        text = _TOKEN_FORMATS.sub(_mask_format, text)
    text = _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    text = "".join(_mask_sas(tok) for tok in re.split(r"(\s+)", text))
    text = _AUTHORIZATION.sub(_mask_authorization, text)
    text = _BEARER.sub(lambda m: f"{m['scheme']} {MASK}", text)
    text = _BASIC.sub(_mask_basic, text)
    return _mask_assignments(text)


# ------------------------------------------------------------------------------------------------ structures

def mask_secrets(flat: Mapping[str, Any]) -> Dict[str, Any]:
    """A copy of a flat ``{dotted key: value}`` dict with secrets replaced by ``***`` (both rules)."""
    known = _longest_first(known_secrets())
    out: Dict[str, Any] = {}
    for k, v in flat.items():
        if is_secret_key(k) and v is not None:
            out[k] = MASK
        elif isinstance(v, str):
            out[k] = _mask(v, known) if v else v
        else:
            out[k] = v
    return out


def mask_config(nested: Any) -> Any:
    """A nested job config (``cfg.to_dict()``) with the values :func:`mask_secrets` masks in its flat form.

    Keys are flattened as :func:`sparktrain.config.flatten` does: ``a.b.c``, and a
    list of ``{name: ...}`` mappings (``features:``) as ``<key>.<name>.<setting>``.

    Examples
    --------
    >>> mask_config({"spark": {"conf": {"spark.hadoop.fs.s3a.secret.key": "abc"}}, "data": {"key": "id"}})
    {'spark': {'conf': {'spark.hadoop.fs.s3a.secret.key': '***'}}, 'data': {'key': 'id'}}
    """
    known = _longest_first(known_secrets())

    def walk(node: Any, prefix: str) -> Any:
        if isinstance(node, Mapping):
            return {k: walk(v, f"{prefix}{k}.") for k, v in node.items()}
        if isinstance(node, (list, tuple)) and node and all(isinstance(x, Mapping) and "name" in x for x in node):
            return [{"name": x["name"], **{k: walk(v, f"{prefix}{x['name']}.{k}.")
                                           for k, v in x.items() if k != "name"}} for x in node]
        if node is not None and is_secret_key(prefix[:-1]):
            return MASK
        return _mask_strings(node, known)

    return walk(nested, "")


def mask_strings(body: Any) -> Any:
    """``body`` (JSON-like: dicts, lists, scalars) with :func:`mask_value` applied to every string in it."""
    return _mask_strings(body, _longest_first(known_secrets()))


def _mask_strings(body: Any, known: List[str]) -> Any:
    if isinstance(body, str):
        return _mask(body, known) if body else body
    if isinstance(body, Mapping):
        return {k: _mask_strings(v, known) for k, v in body.items()}
    if isinstance(body, (list, tuple)):
        return [_mask_strings(v, known) for v in body]
    return body


__all__ = ["MASK", "MIN_KNOWN", "NOT_SECRET", "is_secret_key", "known_secrets", "mask_config", "mask_secrets",
           "mask_strings", "mask_value", "remember", "secrets_of"]
