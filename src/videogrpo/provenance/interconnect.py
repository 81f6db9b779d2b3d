"""The interconnect environment: the variables that say how NCCL and libfabric move tensors between GPUs and nodes.

A site gives them in its cluster profile (the train rule's `interconnect_env` resource: `NAME=value` pairs separated
by spaces, docs/options.md#interconnect-settings); training hands them to every node's workers, and the train
manifest records what the workers saw. They change how bytes travel, never what training computes, so they are
environment, not config: no part of the run identity or of a stage's params, and changing them reruns nothing.

`PREFIXES` and `NAMES` are the one list of what counts as one: a profile may set nothing else (a setting outside it
would reach the workers without a record), and the manifest records everything in it, values included (none of
these are secrets).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

from videogrpo.errors import ConfigError

# NCCL's own, PyTorch's process group for NCCL, libfabric (FI_*, the EFA provider's FI_EFA_*), the aws-ofi-nccl
# plugin, rdma-core; and the CUDA setting that orders compute and communication kernels.
PREFIXES = ("NCCL_", "TORCH_NCCL_", "FI_", "OFI_", "RDMAV_")
NAMES = ("CUDA_DEVICE_MAX_CONNECTIONS",)
RESOURCE = "interconnect_env"
"""The train rule's resource a profile sets them in (set-resources: train)."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_interconnect(name: str) -> bool:
    return name in NAMES or name.startswith(PREFIXES)


def recorded(env: Mapping[str, str]) -> dict[str, str]:
    """What a manifest records of an environment: its interconnect variables with their values, sorted."""
    return {name: env[name] for name in sorted(env) if is_interconnect(name)}


def describe(settings: Mapping[str, str]) -> str:
    return " ".join(f"{name}={shlex.quote(value)}" for name, value in settings.items()) or "none set"


def parse(text: str, source: str) -> dict[str, str]:
    """The settings of `text` (`NAME=value NAME=value ...`, shell quoting allowed); `source` names where they were
    written, for the refusal of a bad one."""
    try:
        words = shlex.split(text or "")
    except ValueError as err:
        raise ConfigError(f"{source}: {text!r} is not a list of NAME=value ({err}); close the quote") from None
    settings: dict[str, str] = {}
    for word in words:
        name, equals, value = word.partition("=")
        if not equals or not _NAME.fullmatch(name):
            raise ConfigError(
                f"{source}: {word!r} is not NAME=value; write each setting as NAME=value, separated by spaces "
                f"(e.g. NCCL_DEBUG=WARN FI_PROVIDER=efa)"
            )
        if not is_interconnect(name):
            raise ConfigError(
                f"{source}: {name} is not an interconnect variable (names starting with {', '.join(PREFIXES)}, or "
                f"{', '.join(NAMES)}); set other variables in the job's environment, not here"
            )
        if name in settings and settings[name] != value:
            raise ConfigError(f"{source}: {name} is given twice ({settings[name]!r} and {value!r}); keep one")
        settings[name] = value
    return settings
