"""An exported pool as a Hugging Face dataset: its parquet rows and its dataset card.

:func:`rows_of` turns the release's manifest records into one flat row an environment
(:data:`COLUMNS`: nested values as JSON text, so every row has the same schema);
:func:`parquet_bytes` writes them with pyarrow (the ``trl`` extra brings it; a typed error
names the extra otherwise); :func:`dataset_card` is the ``README.md`` whose YAML header tells
``datasets.load_dataset(DIR)`` where the data is, and whose body gives the licence, the spadekit
version, the run's config, counts by skill and validity and how to load the pool.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from typing import Any, Mapping, Sequence

from spadekit.common.errors import ConfigError
from spadekit.runs.release import STAT_KEYS, gym_id

__all__ = ["COLUMNS", "dataset_card", "parquet_bytes", "rows_of"]

_TEXT = ("id", "sha256", "gym_id", "game_file", "class_name", "skill", "domain", "status",
         "removed_reason", "source", "hint", "code")
_INT = ("created_step", "retired_step", "n_plays", "n_plays_with_hint")
_FLOAT = ("win_rate", "win_rate_with_hint", "regret", "designer_reward")
_JSON = ("validation", "lineage", "meta")
COLUMNS = (*_TEXT, *_INT, *_FLOAT, "valid", "parents", *_JSON)
"""The dataset's columns, in order."""


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, sort_keys=True)


def rows_of(manifest: Sequence[Mapping[str, Any]], validations: Sequence[Mapping[str, Any]],
            codes: Sequence[str], pool_name: str) -> list[dict[str, Any]]:
    """One row per manifest record (same order), with its code and validation report."""
    rows = []
    for record, check, code in zip(manifest, validations, codes, strict=True):
        row = {k: record.get(k) for k in (*_TEXT, *_INT, *_FLOAT) if k not in ("code", "gym_id")}
        row.update(code=code, gym_id=gym_id(pool_name, record["id"]), valid=bool(record["valid"]),
                   parents=[str(p) for p in record.get("parents") or []],
                   validation=_dump(check.get("validation")), lineage=_dump(record["lineage"]),
                   meta=_dump(record["meta"]))
        rows.append({k: row[k] for k in COLUMNS})
    return rows


def parquet_bytes(rows: Sequence[Mapping[str, Any]]) -> bytes:
    """The rows as one parquet file (explicit schema: an all-null column keeps its type)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("writing the dataset needs pyarrow: install the trl extra (`bash "
                          "install.sh` does), or export with --format release") from None
    types = {**{k: pa.string() for k in (*_TEXT, *_JSON)}, **{k: pa.int64() for k in _INT},
             **{k: pa.float64() for k in _FLOAT}, "valid": pa.bool_(),
             "parents": pa.list_(pa.string())}
    schema = pa.schema([pa.field(k, types[k]) for k in COLUMNS])
    table = pa.Table.from_pylist([dict(r) for r in rows], schema=schema)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def _table(counts: Mapping[str, Counter]) -> str:
    lines = ["| skill | valid | removed | total |", "|---|---|---|---|"]
    for skill, c in sorted(counts.items()):
        lines.append(f"| {skill} | {c['valid']} | {c['removed']} | {c['total']} |")
    return "\n".join(lines)


def dataset_card(rows: Sequence[Mapping[str, Any]], snapshot: Mapping[str, Any],
                 config: str | None, data_file: str) -> bytes:
    """The ``README.md`` of the export (see the module docstring)."""
    name, licence = snapshot["name"], snapshot["license"]
    counts: dict[str, Counter] = {}
    for row in rows:
        c = counts.setdefault(row["skill"] or "unknown", Counter())
        c["total"] += 1
        c["valid" if row["valid"] else "invalid"] += 1
        c["removed"] += row["status"] == "blacklisted"
    source = snapshot["source"]
    header = "\n".join([
        "---", f"license: {licence}", f"pretty_name: {json.dumps(f'spadekit pool {name}')}",
        "tags:", "- spadekit", "- spade", "- reinforcement-learning", "- environments",
        "configs:", "- config_name: default", "  data_files:", "  - split: train",
        f"    path: {data_file}", "---", ""])
    body = f"""# spadekit pool `{name}`

{len(rows)} environment programs designed by a SPADE run and validated in spadekit's sandbox
(spadekit {snapshot['spadekit_version']}; from the {source['kind']} `{source['name']}`
{f"after {source['rounds']} round(s)" if source.get('rounds') is not None else ""}; included:
{snapshot['included']}). Licence: {licence}{" (not stated: pass --license)" if licence ==
"unknown" else ""}.

Each row is one program: `code` (a Gymnasium-style `reset()`/`step()` class over text), its
privileged `hint`, `skill`, `status`, `removed_reason`, `validation` (its sandbox report, JSON),
`lineage` and `parents`, and what the run measured: {", ".join(f"`{k}`" for k in STAT_KEYS)}.
`games/`, `manifest.jsonl`, `validation_manifest.jsonl`, `validation_summary.json` and
`checksums.sha256` hold the same pool in the SPADE reference's released layout.

{_table(counts)}

## Load it

```python
import datasets
pool = datasets.load_dataset("PATH/TO/THIS/DIRECTORY", split="train")
```

```bash
sha256sum -c checksums.sha256                        # every file as exported
spadekit import-reference --release . --out my-pool  # back into a spadekit pool, validated
python examples/trl_pool.py .                        # a few GRPO steps with TRL
```

Programs are model-written code: run them only in a sandbox (`spadekit play`,
`spadekit.integrations.gym_pool.register_pool`, `spadekit.integrations.trl`), never with `exec`.
Kit programs import `spadekit.envs.gamekit` (the version is in `meta`).
"""
    if config:
        body += f"\n## The run's config\n\n```yaml\n{config.rstrip()}\n```\n"
    return (header + body).encode("utf-8")
