"""Search spaces: parameter types, hard constraints, the SearchSpace, device descriptors."""

from ._params import Boolean, Categorical, IntRange, Param, PowerOfTwo, Value, param_from_values
from ._space import Config, ConfigError, Constraint, SearchSpace
from .devices import DEVICES, Device, get_device

__all__ = [
    "Boolean",
    "Categorical",
    "Config",
    "ConfigError",
    "Constraint",
    "DEVICES",
    "Device",
    "IntRange",
    "Param",
    "PowerOfTwo",
    "SearchSpace",
    "Value",
    "get_device",
    "param_from_values",
]
