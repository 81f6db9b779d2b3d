"""The evaluation matrix's cells as the config names them: which (model, sampler) pairs a run evaluates, and what a
sampler's name means.

A run's cells are matrix.models x matrix.samplers and, always, its held-out check: the trained model, and the base
model unless matrix.compare_base is off, sampled with the training sampler (`training_sampler`). A cell that both
name is one cell (the tiny default's flowcps-0.7 column is its check), so no video set is generated twice.

Sampler names, one grammar for the config check, the workflow's wildcards and generation:
- `unipc`, `euler`, `dpm_solver`: the ODE samplers (`dpm_solver`: DPM-Solver++ (2M), DiffusionNFT's rollouts);
- `flowcps-<eta>`, eta in [0, 1]: the Flow-CPS transition at that noise level;
- `dancegrpo-<eta>`, eta > 0: DanceGRPO's RF-SDE transition;
- `flowgrpo`: the Flow-GRPO SDE of its Wan ports (its noise level is the sigma schedule's own: no eta);
- `flowgrpo_sde-<eta>`, eta > 0: Flow-GRPO's own `sde` step (its image models, MixGRPO, GRPO-Guard);
- `flowcps-uniform-<lo>-<hi>`, 0 <= lo < hi <= 1: Flow-CPS with each sample's eta drawn uniformly from [lo, hi]
  (training's per-prompt range, grpo.eta_range), keyed by the cell's seed and the sample.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from videogrpo.errors import ConfigError

_NUMBER = r"((?:0|[1-9]\d*)(?:\.\d+)?)"  # no leading zeros: one name per noise level
_PLAIN = re.compile(r"^(unipc|euler|dpm_solver|flowgrpo)$")
_AT_ETA = re.compile(rf"^(flowcps|dancegrpo|flowgrpo_sde)-{_NUMBER}$")
_UNIFORM = re.compile(rf"^flowcps-uniform-{_NUMBER}-{_NUMBER}$")
RUN_MODELS = ("base", "trained", "best", "ema", "refined", "base_refiners")
"""The matrix models a run makes itself: the base model, the trained weights, and the exports beside them (best/:
train.keep_best_by; ema/: train.ema_decay), and the trained weights behind the prompt refiners (REFINED_MODELS);
every other name is one of matrix.hub_models."""
REFINED_MODELS = {"refined": "trained", "base_refiners": "base"}
"""The matrix models whose prompts the refiners (the `refiners` section) rewrite first, by which refiners: the
trained generator with the trained refiners (`refined`), or with the refiners it started from (`base_refiners`).
`trained` is the trained generator alone, on the samples' own prompts."""
GRAMMAR = (
    "unipc, euler, dpm_solver, flowgrpo, flowcps-<eta in [0, 1]>, dancegrpo-<eta > 0>, flowgrpo_sde-<eta > 0> or "
    "flowcps-uniform-<lo>-<hi>"
)


@dataclass(frozen=True)
class Sampler:
    kind: str
    """`unipc`, `euler`, `dpm_solver` (ODE), or a training transition: `flowcps`, `dancegrpo`, `flowgrpo`,
    `flowgrpo_sde`."""
    noise: float = 0.0
    """The transition's noise level eta (flowcps, dancegrpo, flowgrpo_sde)."""
    noise_range: tuple[float, float] | None = None
    """Flow-CPS only: each sample's eta drawn uniformly from [lo, hi] instead of `noise`."""


def _sampler_or_problem(name: str) -> Sampler | str:
    if _PLAIN.match(name):
        return Sampler(name)
    if match := _AT_ETA.match(name):
        kind, eta = match.group(1), float(match.group(2))
        if kind == "flowcps" and eta > 1:
            return f"{name!r}: Flow-CPS noise must be in [0, 1]"
        if kind == "dancegrpo" and eta == 0:
            return f"{name!r}: DanceGRPO needs eta > 0 (its noise std eta sqrt(sigma - sigma') must not vanish)"
        if kind == "flowgrpo_sde" and eta == 0:
            return f"{name!r}: Flow-GRPO's sde step needs eta > 0 (its noise std must not vanish)"
        return Sampler(kind, eta)
    if match := _UNIFORM.match(name):
        lo, hi = float(match.group(1)), float(match.group(2))
        if not 0 <= lo < hi <= 1:
            return f"{name!r}: the range must be lo < hi within [0, 1]"
        return Sampler("flowcps", noise_range=(lo, hi))
    return f"{name!r} is not a sampler: use {GRAMMAR}"


def sampler_problem(name: str) -> str | None:
    """Why `name` is no sampler of the grammar (the config check's wording), or None."""
    found = _sampler_or_problem(name)
    return found if isinstance(found, str) else None


def parse_sampler(name: str) -> Sampler:
    """A sampler cell name as the grammar reads it; a name outside it is refused naming the grammar."""
    found = _sampler_or_problem(name)
    if isinstance(found, str):
        raise ConfigError(f"matrix.samplers: {found}")
    return found


def number_text(value: float) -> str:
    """A noise level as a cell name writes it: the shortest decimal that reads back as the same float, never in
    exponent notation (0.7 -> `0.7`, 1 -> `1.0`, 1e-05 -> `0.00001`), so that the name fits the grammar."""
    text = repr(float(value))
    return format(Decimal(text), "f") if "e" in text else text


def training_sampler(cfg) -> str:
    """The cell name of the sampler training rolls out with (grpo.sampler at grpo.eta, or grpo.eta_range): the
    held-out check's column."""
    g = cfg.grpo
    if g.eta_range:
        lo, hi = g.eta_range
        return f"flowcps-uniform-{number_text(lo)}-{number_text(hi)}"
    if g.sampler in ("flowgrpo", "euler", "dpm_solver"):  # no noise level in the name
        return g.sampler
    return f"{g.sampler}-{number_text(g.eta)}"


def check_models(cfg) -> tuple[str, ...]:
    """The held-out check's models: the base first (as a row above the trained one), unless compare_base is off."""
    return ("base", "trained") if cfg.matrix.compare_base else ("trained",)


def matrix_cells(cfg) -> list[tuple[str, str]]:
    """Every (model, sampler) cell of the run: matrix.models x matrix.samplers, then the held-out check's cells that
    the product does not already hold."""
    cells = [(model, sampler) for model in cfg.matrix.models for sampler in cfg.matrix.samplers]
    check = training_sampler(cfg)
    return cells + [(model, check) for model in check_models(cfg) if (model, check) not in cells]


def cell_model_names(cfg) -> list[str]:
    """The models of the run's cells, each once, in cell order."""
    return list(dict.fromkeys(model for model, _ in matrix_cells(cfg)))
