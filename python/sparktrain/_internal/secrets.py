"""Secrets never reach MLflow params, tags, artifacts, logs or printed reports.

Two rules, applied by :func:`mask_secrets` to a flat ``{dotted key: value}``
config and by :func:`mask_value` to any string sparktrain logs or records
(a master URL, a tracking URI, a config value).

By key: :func:`is_secret_key`
-----------------------------
A flattened config key (``a.b.c``) is split into words at ``.``, ``_``,
``-``, ``/``, spaces and camelCase boundaries, lower-cased.  Its value is
replaced by ``***`` when a word

* contains ``token``, ``password``, ``passwd``, ``secret``, ``credential``
  or ``signature``;
* is ``key``/``keys`` or ends in ``key`` (``apikey``, ``accessKey``,
  ``fs.s3a.secret.key``);
* is ``sas`` (Azure SAS tokens: ``fs.azure.sas.<container>.<account>...``)
  or ``sig``.

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
* a ``name=value`` parameter at the start of the value, after ``?``, ``&``
  or ``;``, or as a ``-Dname=value`` Java option, whose name is secret by the
  key rule above (``token``, ``sig``, ``X-Amz-Signature``...) or is ``pwd``
  or ``auth``: its value (up to the next ``&``, ``;`` or space) -> ``***``.
  A ``name=value`` after a plain space is prose (``use KEY=VALUE``) and
  stays.  This covers Spark Connect URLs
  (``sc://host:15002/;token=abc`` -> ``sc://host:15002/;token=***``;
  ``user_id`` stays), ``?token=``/``&access_token=`` query strings and
  ``-Dfs.s3a.secret.key=...`` Java options;
* ``Bearer <token>`` -> ``Bearer ***``.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping

MASK = "***"
#: Keys whose value is a column name by the config schema (see the module docstring).
NOT_SECRET = frozenset({"data.key"})
_SECRET_PARTS = ("token", "password", "passwd", "secret", "credential", "signature")
_SECRET_WORDS = frozenset({"key", "keys", "sas", "sig"})
#: Parameter names that are secret inside a value although the key rule does not match them.
_SECRET_PARAMS = frozenset({"pwd", "auth"})
_WORD_SPLIT = re.compile(r"[._\-/\s]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_URL_PASSWORD = re.compile(r"(?P<scheme>\b[a-zA-Z][\w+.\-]*://)(?P<user>[^:/@\s]*):(?P<pw>\S*)@")
_PARAM = re.compile(r"(?P<lead>^|[?&;\s])(?P<opt>-D)?(?P<name>[A-Za-z_][\w.\-]*)=(?P<value>[^&;\s]*)")
_SAS = re.compile(r"(?:^|[?&;])sig=", re.IGNORECASE)
_BEARER = re.compile(r"(?i)\b(bearer)\s+[\w\-.~+/]+=*")


def _words(key: str) -> List[str]:
    out: List[str] = []
    for part in _WORD_SPLIT.split(key):
        out += [w.lower() for w in _CAMEL.split(part) if w]
    return out


def is_secret_key(key: str) -> bool:
    """Whether the dotted config ``key`` names a secret (the key rule of the module docstring).

    Examples
    --------
    >>> is_secret_key("spark.conf.spark.hadoop.fs.s3a.secret.key"), is_secret_key("data.key")
    (True, False)
    >>> is_secret_key("tracking.apiToken"), is_secret_key("features.monkey_key.type")
    (True, False)
    >>> is_secret_key("spark.conf.spark.sql.shuffle.partitions")
    False
    """
    if key in NOT_SECRET:
        return False
    parts = key.split(".")
    if parts[0] == "features" and len(parts) > 2:  # features.<column name>.<setting>
        parts = [parts[0], *parts[2:]]
    for word in _words(".".join(parts)):
        if any(s in word for s in _SECRET_PARTS) or word in _SECRET_WORDS or word.endswith("key"):
            return True
    return False


def _mask_sas(token: str) -> str:
    if not _SAS.search(token):
        return token
    if "?" in token:
        return token[:token.index("?") + 1] + MASK
    return MASK


def _mask_param(m: "re.Match[str]") -> str:
    name = m["name"]
    if m["lead"].isspace() and not m["opt"]:  # prose ("use KEY=VALUE"), not a parameter
        return m.group(0)
    if m["value"] and m["value"] != MASK and (name.lower() in _SECRET_PARAMS or is_secret_key(name)):
        return f"{m['lead']}{m['opt'] or ''}{name}={MASK}"
    return m.group(0)


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
    """
    if not value:
        return value
    text = _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", value)
    text = "".join(_mask_sas(tok) for tok in re.split(r"(\s+)", text))
    text = _PARAM.sub(_mask_param, text)
    return _BEARER.sub(lambda m: f"{m[1]} {MASK}", text)


def mask_secrets(flat: Mapping[str, Any]) -> Dict[str, Any]:
    """A copy of a flat ``{dotted key: value}`` dict with secrets replaced by ``***`` (both rules)."""
    out: Dict[str, Any] = {}
    for k, v in flat.items():
        if is_secret_key(k) and v is not None:
            out[k] = MASK
        elif isinstance(v, str):
            out[k] = mask_value(v)
        else:
            out[k] = v
    return out


__all__ = ["MASK", "NOT_SECRET", "is_secret_key", "mask_secrets", "mask_value"]
