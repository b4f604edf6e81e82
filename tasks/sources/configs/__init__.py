"""A source kind's config as one pydantic model, and the one way its faults become a
`ConfigError`.

Each kind (`tasks.sources.filesystem`, `website`, `sql`, `rest`) declares its config as a
`KindConfig`: an unknown key is refused (``extra="forbid"``), each field is checked by its type
and its validators, and ``stored()`` is the normalised config the registry keeps. A validator
raises `ConfigError` with the kind's own message (what is wrong, what to do); pydantic's own
faults (a missing or mistyped field, an unknown key) are worded by the model's `unknown` and
`invalid`, which never show the value given (a config may hold what looks like a secret).
When a config has several faults, the message names the unknown keys first, else the first
fault in the order the model declares its fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import ErrorDetails

from core.errors import ConfigError

_MAPPING_FAULTS = frozenset({"model_type", "model_attributes_type", "dict_type"})


class KindConfig(BaseModel):
    """The config of one source kind; `check` is the only way in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    label: ClassVar[str] = "source"
    """How messages name the kind (``"sql source"``)."""

    @classmethod
    def check(cls, config: Any) -> Self:
        """``config`` checked and normalised.

        Raises:
            ConfigError: it is not a mapping, has an unknown key, or a field is missing or
                invalid; the message says which and what to do.
        """
        if not isinstance(config, Mapping):
            raise ConfigError(cls.not_a_mapping(config))
        try:
            return cls.model_validate(dict(config))
        except ValidationError as exc:
            error = cls._config_error(exc)
        raise error  # outside the handler: pydantic's error (it holds the input) is not chained

    def stored(self) -> dict[str, Any]:
        """The config the registry keeps (a kind overrides it to keep its keys' order)."""
        return self.model_dump()

    @classmethod
    def not_a_mapping(cls, config: Any) -> str:
        return f"{cls.label}: the config must be a mapping, not {type(config).__name__}"

    @classmethod
    def unknown(cls, where: tuple[str | int, ...], names: list[str]) -> str:
        """The message for the unknown keys ``names`` of the mapping at ``where`` (``()``: the
        config itself)."""
        at = f" {dotted(where)}" if where else ""
        return f"{cls.label}: unknown{at} key(s) {', '.join(names)}; leave them out"

    @classmethod
    def invalid(cls, where: tuple[str | int, ...], error: ErrorDetails) -> str:
        """The message for a fault pydantic found itself (no validator of the kind's worded
        it), without the value given."""
        fault = error["type"]
        if fault == "missing":
            what = "is required"
        elif fault in _MAPPING_FAULTS:
            what = "must be a mapping"
        else:
            what = f"is not valid: {error['msg']}"
        return f"{cls.label}: {dotted(where) or 'the config'} {what}"

    @classmethod
    def _config_error(cls, exc: ValidationError) -> ConfigError:
        errors = exc.errors()
        unknown = [e for e in errors if e["type"] == "extra_forbidden"]
        if unknown:
            where = min((e["loc"][:-1] for e in unknown), key=len)
            names = sorted(str(e["loc"][-1]) for e in unknown if e["loc"][:-1] == where)
            return ConfigError(cls.unknown(where, names))
        first = errors[0]
        worded = first.get("ctx", {}).get("error")
        if isinstance(worded, ConfigError):
            return worded
        return ConfigError(cls.invalid(first["loc"], first))


def dotted(loc: tuple[str | int, ...]) -> str:
    """A pydantic location as the config's path: ``client.auth``, ``key[0]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out
