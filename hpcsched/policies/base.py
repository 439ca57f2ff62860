"""The policy contract: what a policy is, every hook it may have, its parameters, and the one
error a policy's configuration raises.

A policy is a :class:`PolicyBase` (the :class:`Policy` protocol spells the same contract for
type checkers): a ``name``, frozen ``params`` (a :class:`Params` dataclass), a pure
``decide(snapshot, seed) -> Plan``, and three hooks with defaults that a policy overrides when
it needs to:

* ``reconcile_gate``: fields of :class:`~hpcsched.policies.reconcile.Costs` that replace the
  configured ones when reconcile judges this policy's plans (default: none);
* ``judged_view(snapshot)``: the snapshot reconcile judges the plan on (default: the one given);
* ``round_on_events``: whether the daemon and the simulator also run a round when a job ends or
  a submitted job finds no room (default: no).

A wrapper (:class:`hpcsched.policies.composite.Placed`) delegates every hook to the policy it
wraps. A policy that keeps no state between rounds is just a function ``decide(snapshot, seed,
**params) -> Plan`` with a :class:`Params` class; :func:`stateless` makes it a policy.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Protocol, Self, TypeAlias, cast, runtime_checkable

from hpcsched.model.snapshot import ClusterSnapshot, Plan


class PolicyError(ValueError):
    """Unknown policy name or invalid policy parameters."""


@dataclasses.dataclass(frozen=True)
class Params:
    """Base of every policy's parameters: a frozen dataclass whose fields are the keys a policy
    takes. Field types are checked when it is made (``int``, ``float``, ``bool``, ``str``,
    ``X | None``, ``tuple[float, ...]``: a float field takes an int, a tuple field any list),
    then :meth:`check` checks the values.

    Raises (when made):
        ValueError: a value of the wrong type, or one :meth:`check` refuses.
    """

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = _typed(f.name, getattr(self, f.name), hints[f.name])
            object.__setattr__(self, f.name, value)
        self.check()

    def check(self) -> None:
        """Refuse values out of range (override). Raises ValueError saying which and why."""

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The parameter names, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def parse(cls, policy: str, values: Mapping[str, Any], extra: tuple[str, ...] = ()) -> Self:
        """``values`` as this class, for the policy named ``policy``.

        ``extra``: keys taken elsewhere (a placement stage's), listed among the valid keys.

        Raises:
            PolicyError: an unknown key or a bad value; the message names the policy and lists
                every valid key.
        """
        keys = cls.keys() + tuple(k for k in extra if k not in cls.keys())
        valid = f"valid keys: {', '.join(keys) or '(none)'}"
        unknown = sorted(set(values) - set(cls.keys()))
        if unknown:
            raise PolicyError(f"policy {policy!r}: unknown parameter(s) {', '.join(unknown)}; "
                              f"{valid}")
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise PolicyError(f"policy {policy!r}: {exc}; {valid}") from None


@dataclasses.dataclass(frozen=True)
class NoParams(Params):
    """The parameters of a policy that takes none."""


def _typed(name: str, value: Any, hint: Any) -> Any:
    """``value`` checked against the field type ``hint`` (ints widened to float, sequences to
    tuples). Raises ValueError naming the field."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _typed_union(name, value, args)
    if origin is tuple:
        return _typed_tuple(name, value, args[0])
    return _typed_scalar(name, value, hint)


def _typed_union(name: str, value: Any, args: tuple[Any, ...]) -> Any:
    """``value`` against a union of the types ``args``: ``None`` where the union allows it;
    otherwise checked against the one type besides ``None`` (``X | None``), or taken as it is
    when the union has several."""
    if value is None and type(None) in args:
        return None
    inner = [a for a in args if a is not type(None)]
    return _typed(name, value, inner[0]) if len(inner) == 1 else value


def _typed_tuple(name: str, value: Any, item: Any) -> tuple:
    """``value``, a list or tuple (not a string), as a tuple of items each checked against
    ``item``. Raises ValueError naming the field otherwise."""
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise ValueError(f"{name} must be a list, got {value!r}")
    return tuple(_typed(name, v, item) for v in value)


def _typed_scalar(name: str, value: Any, hint: Any) -> Any:
    """``value`` against a plain ``int``, ``float``, ``bool`` or ``str`` field (an int or a
    float for ``float``, widened; a bool is no int); any other ``hint`` takes it as it is.
    Raises ValueError naming the field and the kind it wants."""
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hint in (int, bool, str) and isinstance(value, hint) and (
            hint is bool or not isinstance(value, bool)):
        return value
    if hint in (int, float, bool, str):
        kind = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
        raise ValueError(f"{name} must be {kind[hint]}, got {value!r}")
    return value


#: :class:`Params` under another name, for the annotations inside classes whose own ``Params``
#: attribute hides the class's name there
_ParamsClass: TypeAlias = Params


@runtime_checkable
class Policy(Protocol):
    """What every policy is (:class:`PolicyBase` implements it with defaults)."""

    name: str
    params: Params

    # read-only: a wrapper (composite.Placed) gives the wrapped policy's
    @property
    def reconcile_gate(self) -> Mapping[str, float]: ...

    @property
    def round_on_events(self) -> bool: ...

    def decide(self, snapshot: ClusterSnapshot, seed: int = 0) -> Plan: ...

    def judged_view(self, snapshot: ClusterSnapshot) -> ClusterSnapshot: ...


class PolicyFactory(Protocol):
    """What makes a policy: called with its parameters (keywords), it makes the policy; its
    ``Params`` attribute is their :class:`Params` class (a :class:`PolicyBase` subclass, or
    what :func:`stateless` returns)."""

    Params: type[_ParamsClass]

    def __call__(self, **values: Any) -> Policy: ...


class PolicyBase:
    """A policy with every hook at its default (module docstring); subclasses set ``name``,
    ``Params`` and ``decide``, and override the hooks they need.

    ``PolicyBase(**values)`` checks ``values`` against ``Params`` into ``self.params``; a
    subclass whose constructor does more calls it first, or sets ``params`` itself.

    Raises (constructor):
        PolicyError: an unknown key or bad value (the message lists the valid keys).
    """

    name: str = "policy"
    # not a ClassVar: a FunctionPolicy sets its own
    Params: type[_ParamsClass] = NoParams
    params: _ParamsClass = NoParams()
    #: fields of reconcile's :class:`~hpcsched.policies.reconcile.Costs` replaced for this
    #: policy's plans (:func:`hpcsched.policies.round.decide_round`); default: none
    reconcile_gate: Mapping[str, float] = types.MappingProxyType({})
    #: also round when a job ends or a submitted job finds no room (:func:`rounds_on_events`)
    round_on_events: bool = False

    def __init__(self, **values: Any):
        self.params = self.Params.parse(self.name, values)

    def decide(self, snapshot: ClusterSnapshot, seed: int = 0) -> Plan:
        """The plan for ``snapshot`` (pure; randomness only from ``seed``)."""
        raise NotImplementedError

    def judged_view(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """The snapshot reconcile judges this policy's plan for ``snapshot`` on: the one the
        plan was made on (default: ``snapshot`` itself)."""
        return snapshot


def rounds_on_events(policy: Policy | None, enabled: bool = True) -> bool:
    """Whether rounds run also at job ends and at submissions that find no room: ``enabled``
    (the daemon's ``daemon.event_rounds``, the simulator's ``SimConfig.event_rounds``) and the
    policy asks for them (its ``round_on_events``: ``jct``). ``None``: no policy, no."""
    return bool(enabled and policy is not None and policy.round_on_events)


DecideFunction = Callable[..., Plan]    # decide(snapshot, seed, **params) -> Plan


class FunctionPolicy(PolicyBase):
    """A stateless policy: ``decide(snapshot, seed, **params)`` with ``params`` bound."""

    def __init__(self, name: str, decide: DecideFunction, params: Params):
        self.name, self._decide, self.params = name, decide, params
        self.Params = type(params)

    def decide(self, snapshot: ClusterSnapshot, seed: int = 0) -> Plan:
        return self._decide(snapshot, seed, **dataclasses.asdict(self.params))


def stateless(name: str, decide: DecideFunction, params: type[Params] = NoParams
              ) -> PolicyFactory:
    """A factory of :class:`FunctionPolicy`: ``factory(**values)`` checks ``values`` against
    ``params`` (the policy's :class:`Params`; its fields are ``decide``'s keywords).

    Raises (from the factory):
        PolicyError: an unknown key or a bad value (the message lists the valid keys).
    """

    def factory(**values: Any) -> PolicyBase:
        return FunctionPolicy(name, decide, params.parse(name, values))

    made = cast(PolicyFactory, factory)    # a function given its Params below
    made.Params = params
    return made
