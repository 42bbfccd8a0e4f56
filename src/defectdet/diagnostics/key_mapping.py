"""Key renaming between a checkpoint and a model: propose rules from the keys and shapes, apply regex rules.

A rules file is YAML: a list of `{pattern: REGEX, replace: TEXT}` (Python `re.sub` syntax, `\\1` for groups).
Rules apply in order, each to the result of the previous one, like a chain of `sed` expressions.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from defectdet.errors import CheckpointError, ConfigError

Shapes = Mapping[str, tuple[int, ...]]


@dataclasses.dataclass
class RenameRule:
    """`re.sub(pattern, replace, key, count=1)`; `reason` says why it was proposed."""

    pattern: str
    replace: str
    reason: str = ""

    def to_yaml_dict(self) -> dict[str, str]:
        return {"pattern": self.pattern, "replace": self.replace}


def prefix_rule(source: str, target: str, reason: str) -> RenameRule:
    """Replace the dotted prefix `source` (may be '') by `target` (may be '')."""
    pattern = "^" + (re.escape(source + ".") if source else "")
    return RenameRule(pattern, f"{target}." if target else "", reason)


def load_rules(path: str | Path) -> list[RenameRule]:
    """Read a rules file; an invalid entry or regex raises ConfigError naming the file and the rule."""
    import yaml

    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: mapping file not found") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML ({error})") from None
    if isinstance(document, dict) and "rules" in document:
        document = document["rules"]
    if not isinstance(document, list):
        raise ConfigError(
            f"{path}: expected a list of {{pattern, replace}} rules, found {type(document).__name__}"
        )
    rules = []
    for index, entry in enumerate(document):
        if (
            not isinstance(entry, dict)
            or set(entry) - {"pattern", "replace", "reason"}
            or "pattern" not in entry
        ):
            raise ConfigError(
                f"{path}: rule {index + 1} must have keys 'pattern' and 'replace', got {entry!r}"
            )
        try:
            re.compile(str(entry["pattern"]))
        except re.error as error:
            raise ConfigError(
                f"{path}: rule {index + 1}: invalid regex {entry['pattern']!r} ({error})"
            ) from None
        rules.append(
            RenameRule(str(entry["pattern"]), str(entry.get("replace") or ""), str(entry.get("reason", "")))
        )
    return rules


def save_rules(rules: Iterable[RenameRule], path: str | Path) -> Path:
    import yaml

    path = Path(path)
    path.write_text(yaml.safe_dump([rule.to_yaml_dict() for rule in rules], sort_keys=False))
    return path


def rename_key(key: str, rules: Iterable[RenameRule]) -> str:
    for rule in rules:
        key = re.sub(rule.pattern, rule.replace, key, count=1)
    return key


def apply_rules(
    state_dict: Mapping[str, Any], rules: list[RenameRule], source: str = "checkpoint"
) -> dict[str, Any]:
    """Rename every key; two keys renamed to the same name raise CheckpointError naming both."""
    renamed: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key, value in state_dict.items():
        new_key = rename_key(key, rules)
        if new_key in renamed:
            raise CheckpointError(
                f"{source}: the mapping renames both {origin[new_key]!r} and {key!r} to {new_key!r}"
            )
        renamed[new_key], origin[new_key] = value, key
    return renamed


def _wrapper_rules(source_keys: list[str], target_keys: list[str]) -> list[RenameRule]:
    rules: list[RenameRule] = []
    keys = list(source_keys)
    target_has_module = any(key.startswith("module.") for key in target_keys)
    while keys and all(key.startswith("module.") for key in keys) and not target_has_module:
        rules.append(
            RenameRule(r"^module\.", "", "'module.' prefix from DataParallel / DistributedDataParallel")
        )
        keys = [key[len("module.") :] for key in keys]
    if any("_orig_mod." in key for key in keys) and not any("_orig_mod." in key for key in target_keys):
        rules.append(RenameRule(r"(^|\.)_orig_mod\.", r"\1", "'_orig_mod.' from torch.compile"))
        keys = [re.sub(r"(^|\.)_orig_mod\.", r"\1", key) for key in keys]
        while keys and all(key.startswith("module.") for key in keys) and not target_has_module:
            rules.append(
                RenameRule(r"^module\.", "", "'module.' prefix from DataParallel / DistributedDataParallel")
            )
            keys = [key[len("module.") :] for key in keys]
    return rules + _common_prefix_rules(keys, target_keys)


def _first_segment(keys: list[str]) -> str | None:
    """The first dotted segment when every key has the same one."""
    firsts = {key.split(".", 1)[0] for key in keys if "." in key}
    if len(firsts) == 1 and all("." in key for key in keys):
        return firsts.pop()
    return None


def _common_prefix_rules(source_keys: list[str], target_keys: list[str]) -> list[RenameRule]:
    """A whole-model prefix on one side only (Lightning's 'model.', an 'ema.' or 'backbone.' wrapper)."""
    source_first, target_first = _first_segment(source_keys), _first_segment(target_keys)
    if (
        source_first
        and source_first != target_first
        and not any(k.startswith(source_first + ".") for k in target_keys)
    ):
        stripped = {key[len(source_first) + 1 :] for key in source_keys}
        if len(stripped & set(target_keys)) > len(set(source_keys) & set(target_keys)):
            return [prefix_rule(source_first, "", f"'{source_first}.' prefix on every key of the checkpoint")]
    if (
        target_first
        and target_first != source_first
        and not any(k.startswith(target_first + ".") for k in source_keys)
    ):
        added = {f"{target_first}.{key}" for key in source_keys}
        if len(added & set(target_keys)) > len(set(source_keys) & set(target_keys)):
            return [prefix_rule("", target_first, f"the model's keys all start with '{target_first}.'")]
    return []


def _split_common_suffix(source: str, target: str) -> tuple[str, str] | None:
    """('a.3', 'a.4') for ('a.3.conv.weight', 'a.4.conv.weight'); None without a common last segment."""
    source_parts, target_parts = source.split("."), target.split(".")
    common = 0
    while (
        common < min(len(source_parts), len(target_parts))
        and source_parts[-1 - common] == target_parts[-1 - common]
    ):
        common += 1
    if common == 0 or common == len(source_parts) == len(target_parts):
        return None
    return ".".join(source_parts[: len(source_parts) - common]), ".".join(
        target_parts[: len(target_parts) - common]
    )


def _rename_reason(source: str, target: str) -> str:
    source_parts, target_parts = source.split("."), target.split(".")
    if (
        source_parts[:-1] == target_parts[:-1]
        and source_parts[-1].isdigit()
        and target_parts[-1].isdigit()
        and source_parts != target_parts
    ):
        where = ".".join(source_parts[:-1]) or "the top level"
        return f"shifted Sequential index under '{where}' ({source_parts[-1]} -> {target_parts[-1]})"
    if not target:
        return f"prefix '{source}.' on the checkpoint's keys"
    if not source:
        return f"the model's keys start with '{target}.'"
    return f"renamed prefix '{source}' -> '{target}'"


def _best_prefix_rule(
    unmatched_source: Shapes, unmatched_target: Shapes
) -> tuple[str, str, list[str]] | None:
    by_shape: dict[tuple[int, ...], list[str]] = defaultdict(list)
    for key, shape in unmatched_target.items():
        by_shape[shape].append(key)
    candidates: set[tuple[str, str]] = set()
    for key, shape in unmatched_source.items():
        for target in by_shape.get(shape, ()):
            pair = _split_common_suffix(key, target)
            if pair is not None:
                candidates.add(pair)
    best: tuple[str, str, list[str]] | None = None
    for source_prefix, target_prefix in candidates:
        head = source_prefix + "." if source_prefix else ""
        covered = [key for key in unmatched_source if key.startswith(head)]
        hits = []
        for key in covered:
            new_key = (target_prefix + "." if target_prefix else "") + key[len(head) :]
            if unmatched_target.get(new_key) == unmatched_source[key]:
                hits.append(key)
        if hits and len(hits) == len(covered) and (best is None or len(hits) > len(best[2])):
            best = (source_prefix, target_prefix, hits)
    return best


def _parent(key: str) -> str:
    return key.rpartition(".")[0]


def _whole_modules(shapes: Shapes, unmatched: set[str]) -> dict[str, tuple[int, ...]]:
    """Widen `unmatched` to every key of the modules it touches (a BatchNorm bias can match a conv bias by chance)."""
    parents = {_parent(key) for key in unmatched}
    return {key: shape for key, shape in shapes.items() if key in unmatched or _parent(key) in parents}


def _order_renames(renames: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Order prefix renames so that no rule renames another rule's output (a shift 3->4 runs after 4->5)."""
    ordered, pending = [], list(renames)
    while pending:
        sources = {source for source, _ in pending}
        ready = [pair for pair in pending if pair[1] not in sources]
        if not ready:  # a cycle (a swap): go through a placeholder
            source, target = pending.pop(0)
            placeholder = f"__renamed__.{target}" if target else "__renamed__"
            ordered.append((source, placeholder))
            pending.append((placeholder, target))
            continue
        ordered += ready
        pending = [pair for pair in pending if pair not in ready]
    return ordered


def propose_rules(source: Shapes, target: Shapes, max_rules: int = 200) -> list[RenameRule]:
    """Rules that make `source` keys (name -> shape) line up with `target`'s.

    Recognises wrapper prefixes ('module.', '_orig_mod.'), then renamed prefixes and shifted Sequential
    indices, each accepted only when every key under the prefix lands on a target key of the same shape.
    Renames are dropped when they fix fewer keys than stay unmatched: between two different architectures
    equal shapes are coincidences, not renamings.
    """
    rules = _wrapper_rules(list(source), list(target))
    renamed = {rename_key(key, rules): shape for key, shape in source.items()}
    unmatched_source = _whole_modules(renamed, {k for k, s in renamed.items() if target.get(k) != s})
    unmatched_target = _whole_modules(target, {k for k, s in target.items() if renamed.get(k) != s})
    renames: list[tuple[str, str]] = []
    fixed = 0
    while unmatched_source and unmatched_target and len(renames) < max_rules:
        found = _best_prefix_rule(unmatched_source, unmatched_target)
        if found is None:
            break
        source_prefix, target_prefix, hits = found
        renames.append((source_prefix, target_prefix))
        head = source_prefix + "." if source_prefix else ""
        for key in hits:
            new_key = (target_prefix + "." if target_prefix else "") + key[len(head) :]
            del unmatched_source[key]
            del unmatched_target[new_key]
        fixed += len(hits)
    if fixed <= len(unmatched_source) + len(unmatched_target):
        renames = []
    for source_prefix, target_prefix in _order_renames(renames):
        shown_source = source_prefix.replace("__renamed__.", "").replace("__renamed__", "")
        rules.append(prefix_rule(source_prefix, target_prefix, _rename_reason(shown_source, target_prefix)))
    return rules
