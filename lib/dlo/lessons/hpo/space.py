"""One search-space description for Optuna and Ray Tune, validated (one name per hyper-parameter).
"""
from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any, Mapping, Sequence




# --------------------------------------------------------------------------------------------------
# Search spaces: one definition, checked, for Optuna and Ray Tune
# --------------------------------------------------------------------------------------------------


class SearchSpaceError(ValueError):
    """The search space definition is invalid; the message (one line) says which parameter and why."""


_SPEC_KEYS = {
    "float": {"type", "low", "high", "log", "step"},
    "int": {"type", "low", "high", "log", "step"},
    "categorical": {"type", "choices"},
}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _pairs(space: Any) -> list[tuple[Any, Any]]:
    if isinstance(space, Mapping):
        return list(space.items())
    if isinstance(space, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in space):
        return [tuple(p) for p in space]
    raise SearchSpaceError(f"invalid search space: give a dict {{name: spec}} or a list of (name, spec) pairs, "
                           f"got {type(space).__name__}")


def _check_spec(name: str, spec: Any) -> dict[str, Any]:
    where = f"invalid search space: parameter {name!r}"
    if not isinstance(spec, Mapping):
        raise SearchSpaceError(f"{where}: its spec must be a dict such as "
                               f"{{'type': 'float', 'low': 1e-4, 'high': 1.0, 'log': True}}, got {spec!r}")
    kind = spec.get("type")
    if kind not in _SPEC_KEYS:
        raise SearchSpaceError(f"{where} has unknown type {kind!r}: use 'float', 'int' or 'categorical'")
    unknown = sorted(set(spec) - _SPEC_KEYS[kind])
    if unknown:
        raise SearchSpaceError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} for type {kind!r}; "
                               f"allowed: {', '.join(sorted(_SPEC_KEYS[kind]))}")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, (list, tuple)) or len(choices) == 0:
            raise SearchSpaceError(f"{where}: 'choices' must be a non-empty list, got {choices!r}")
        if len(set(map(repr, choices))) != len(choices):
            raise SearchSpaceError(f"{where}: 'choices' lists a value twice: {list(choices)!r}")
        return {"type": "categorical", "choices": list(choices)}
    if "low" not in spec or "high" not in spec:
        raise SearchSpaceError(f"{where} ({kind}) needs both 'low' and 'high'")
    low, high = spec["low"], spec["high"]
    if not (_is_number(low) and _is_number(high)):
        raise SearchSpaceError(f"{where}: low and high must be finite numbers, got low={low!r}, high={high!r}")
    if kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
        raise SearchSpaceError(f"{where} is an int: low and high must be integers, got low={low!r}, high={high!r}")
    if low >= high:
        raise SearchSpaceError(f"{where} has an empty range: low={low!r} >= high={high!r} (low must be below high)")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise SearchSpaceError(f"{where}: 'log' must be True or False, got {log!r}")
    if log and low <= 0:
        raise SearchSpaceError(f"{where}: a log scale needs low > 0 (log(0) does not exist), got low={low!r}")
    step = spec.get("step")
    if step is not None:
        if log:
            raise SearchSpaceError(f"{where}: 'step' and 'log' cannot be combined (Optuna allows one or the other)")
        if not _is_number(step) or step <= 0:
            raise SearchSpaceError(f"{where}: 'step' must be a positive number, got {step!r}")
        if kind == "int" and not float(step).is_integer():
            raise SearchSpaceError(f"{where} is an int: 'step' must be an integer, got {step!r}")
        span = Decimal(str(high)) - Decimal(str(low))  # decimal, as Optuna checks it: 0.9 / 0.1 is 9, not 9.000000000000002
        if span % Decimal(str(step)) != 0:
            raise SearchSpaceError(f"{where}: 'step' {step!r} does not divide the range {low!r}..{high!r} (its values "
                                   f"are low + k * step and must end at high); choose a step that divides high - low")
    out: dict[str, Any] = {"type": kind, "low": low, "high": high, "log": log}
    if kind == "int":
        out.update(low=int(low), high=int(high))
    if step is not None:
        out["step"] = int(step) if kind == "int" else float(step)
    return out


def validate_space(space: Mapping[str, Mapping] | Sequence[tuple[str, Mapping]]) -> dict[str, dict[str, Any]]:
    """Check a search space and return it as ``{name: normalised spec}``; raise :class:`SearchSpaceError` if invalid.

    ``space`` is a dict ``{name: spec}`` or a list of ``(name, spec)`` pairs (a list built in a loop can
    repeat a name; a dict cannot, but see :func:`parse_space_json` for files). A spec is one of::

        {"type": "float", "low": 1e-4, "high": 1.0, "log": True}        # optional "step" (not with log)
        {"type": "int", "low": 16, "high": 256, "log": True}             # optional "step"
        {"type": "categorical", "choices": ["sgd", "adamw"]}

    A ``step`` means the values ``low, low + step, ..., high`` (both bounds included, as in Optuna): it
    must divide ``high - low``.

    Errors, each one line naming the parameter: a name used twice (sampled under one name, two
    hyper-parameters would get the same value), an empty range (``low >= high``), a log scale with
    ``low <= 0``, an unknown type or key, ``step`` with ``log``, a step that does not divide the range.
    """
    pairs = _pairs(space)
    if not pairs:
        raise SearchSpaceError("invalid search space: it is empty; define at least one parameter")
    out: dict[str, dict[str, Any]] = {}
    for name, spec in pairs:
        if not isinstance(name, str) or not name.strip():
            raise SearchSpaceError(f"invalid search space: parameter names must be non-empty strings, got {name!r}")
        if name in out:
            raise SearchSpaceError(f"invalid search space: parameter {name!r} is defined twice; each hyper-parameter "
                                   f"needs its own name (sampled under one name, two parameters get the same value)")
        out[name] = _check_spec(name, spec)
    return out


def parse_space_json(text: str) -> dict[str, dict[str, Any]]:
    """A search space from JSON text, validated. A key written twice is an error (``json.loads`` keeps the last one)."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise SearchSpaceError(f"invalid search space: key {key!r} appears twice in the JSON (json.loads would "
                                       f"silently keep the last one); each hyper-parameter needs its own name")
            seen[key] = value
        return seen

    try:
        raw = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        raise SearchSpaceError(f"invalid search space: not valid JSON ({exc})") from None
    return validate_space(raw)


def suggest(trial, space: Mapping | Sequence) -> dict[str, Any]:
    """Sample every parameter of ``space`` on an Optuna ``trial``, each under its own name."""
    values: dict[str, Any] = {}
    for name, spec in validate_space(space).items():
        if spec["type"] == "categorical":
            values[name] = trial.suggest_categorical(name, spec["choices"])
        elif spec["type"] == "int":
            values[name] = trial.suggest_int(name, spec["low"], spec["high"], step=spec.get("step", 1), log=spec["log"])
        else:
            values[name] = trial.suggest_float(name, spec["low"], spec["high"], step=spec.get("step"), log=spec["log"])
    return values


def grid(spec: Mapping[str, Any]) -> list[int] | list[float]:
    """Every value of a stepped parameter (a validated spec with ``step``): ``low + k * step`` for
    ``k = 0 .. (high - low) / step``, computed as Optuna computes them (so the same floats)."""
    if spec.get("step") is None:
        raise ValueError(f"grid() needs a stepped int or float spec, got {dict(spec)!r}")
    low, step = spec["low"], spec["step"]
    n = int((Decimal(str(spec["high"])) - Decimal(str(low))) / Decimal(str(step)))
    if spec["type"] == "int":
        return [low + k * step for k in range(n + 1)]
    return [k * step + low for k in range(n + 1)]


def to_optuna(space: Mapping | Sequence) -> dict[str, Any]:
    """``{name: optuna distribution}``, e.g. for ``ray.tune.search.optuna.OptunaSearch(space=...)``."""
    from optuna import distributions as D

    out: dict[str, Any] = {}
    for name, spec in validate_space(space).items():
        if spec["type"] == "categorical":
            out[name] = D.CategoricalDistribution(spec["choices"])
        elif spec["type"] == "int":
            out[name] = D.IntDistribution(spec["low"], spec["high"], log=spec["log"], step=spec.get("step", 1))
        else:
            out[name] = D.FloatDistribution(spec["low"], spec["high"], log=spec["log"], step=spec.get("step"))
    return out


def to_ray(space: Mapping | Sequence) -> dict[str, Any]:
    """``{name: ray.tune domain}``: the same space for ``Tuner(param_space=...)`` and PBT's mutations.

    The same *values* as :func:`to_optuna`: a stepped parameter becomes ``tune.choice`` of its
    :func:`grid` (Ray's ``qrandint`` / ``quniform`` round to multiples of the step counted from 0, not
    from ``low``: from 1 to 9 by 2 they give 2, 4, 6, 8 where Optuna gives 1, 3, 5, 7, 9); an int range
    includes ``high``, as in Optuna (Ray's ``randint`` excludes its upper bound, hence ``high + 1``)."""
    from ray import tune

    out: dict[str, Any] = {}
    for name, spec in validate_space(space).items():
        kind = spec["type"]
        if kind == "categorical":
            out[name] = tune.choice(spec["choices"])
        elif spec.get("step") is not None and not (kind == "int" and spec["step"] == 1):
            out[name] = tune.choice(grid(spec))
        elif kind == "float":
            lo, hi = spec["low"], spec["high"]
            out[name] = tune.loguniform(lo, hi) if spec["log"] else tune.uniform(lo, hi)
        else:
            lo, hi = spec["low"], spec["high"]
            out[name] = tune.lograndint(lo, hi + 1) if spec["log"] else tune.randint(lo, hi + 1)
    return out


def clip_to_space(config: Mapping[str, Any], space: Mapping | Sequence) -> dict[str, Any]:
    """``config`` with every parameter of ``space`` brought back inside it: clipped to ``[low, high]``,
    rounded for an int, moved to the nearest value of the grid for a stepped parameter. Categorical
    values and names outside ``space`` are left as they are. What Population Based Training's explore
    step needs: it multiplies a value by 0.8 or 1.2 without looking at the bounds (0.9 x 1.2 = 1.08, a
    momentum no optimiser accepts)."""
    out = dict(config)
    for name, spec in validate_space(space).items():
        if name not in out or spec["type"] == "categorical":
            continue
        value = min(max(out[name], spec["low"]), spec["high"])
        if spec.get("step") is not None:
            values = grid(spec)
            value = values[min(range(len(values)), key=lambda k: abs(values[k] - value))]
        elif spec["type"] == "int":
            value = int(round(value))
        out[name] = int(value) if spec["type"] == "int" else float(value)
    return out


class DuplicateParameterError(ValueError):
    """A hyper-parameter name was sampled twice in one trial."""


class StrictTrial:
    """Wrap an Optuna trial so that sampling the same name twice raises instead of tying two parameters.

    Optuna allows ``trial.suggest_float("lr", ...)`` to be called several times in a trial (a loop may
    ask again) and returns the *first* value each time: if ``"lr"`` was meant for the learning rate and,
    by a copy-paste slip, for the weight decay too, both get the same value in every trial, and nothing
    fails. ``StrictTrial(trial)`` forwards everything to ``trial`` and raises on the second call.
    """

    def __init__(self, trial) -> None:
        self._trial = trial
        self._names: set[str] = set()

    def _record(self, name: str) -> None:
        if name in self._names:
            raise DuplicateParameterError(
                f"hyper-parameter {name!r} is sampled twice in this trial: Optuna would return the first value again, "
                f"tying two parameters together; give each hyper-parameter its own name")
        self._names.add(name)

    def suggest_float(self, name, *args, **kwargs):
        self._record(name)
        return self._trial.suggest_float(name, *args, **kwargs)

    def suggest_int(self, name, *args, **kwargs):
        self._record(name)
        return self._trial.suggest_int(name, *args, **kwargs)

    def suggest_categorical(self, name, *args, **kwargs):
        self._record(name)
        return self._trial.suggest_categorical(name, *args, **kwargs)

    def __getattr__(self, attr):
        return getattr(self._trial, attr)
