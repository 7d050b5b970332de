"""The settings' keys as tests read them: shared by tests/test_config.py and
tests/test_docs_config.py."""

from __future__ import annotations

from types import UnionType
from typing import Literal, Union, get_args, get_origin

from pydantic import BaseModel

from genrm_trio.config import Settings


def literal_keys(model: type[BaseModel], prefix: str = "") -> dict[str, tuple[str, ...]]:
    """Every key of `model` (nested sections as dotted names) whose type is a `Literal`, with its
    values: derived from the settings, so a new choice or a new key is tested without an edit."""
    found: dict[str, tuple[str, ...]] = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        members = [a for a in get_args(annotation) if a is not type(None)]
        if get_origin(annotation) in (Union, UnionType) and len(members) == 1:
            annotation = members[0]  # an optional section: its keys still count
        if get_origin(annotation) is Literal:
            found[prefix + name] = get_args(annotation)
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found |= literal_keys(annotation, f"{prefix}{name}.")
        else:
            assert not any(get_origin(a) is Literal for a in members), f"{name}: optional literal"
    return found


def accepted_values(key: str) -> tuple[str, ...]:
    """Every value the settings accept for the `Literal` key `key` (dotted in a section): a test
    over "every value" parametrized with it covers a new one without an edit."""
    return literal_keys(Settings)[key]
