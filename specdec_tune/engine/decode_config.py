"""The settings of one decode call: the speculative configuration it runs, and what only a decode has."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdec_tune.core.limits import check_num_speculative
from specdec_tune.core.speculative import SpeculativeConfig, with_fields


@dataclass(frozen=True, init=False)
class DecodeConfig:
    """Settings of one decode call (validated on construction).

    The speculative fields live in ``spec`` (:class:`~specdec_tune.core.speculative.SpeculativeConfig`,
    validated there); they may also be given by name, ``DecodeConfig(32, num_speculative_tokens=3)``,
    which changes them in ``spec`` (default: ``SpeculativeConfig()``). ``autoregressive`` reads only
    ``max_new_tokens``, ``temperature`` and ``eos_token_id``.

    Attributes:
        max_new_tokens: the most tokens generated (>= 1).
        spec: what to speculate; N >= 1 (plain decoding is ``engine.autoregressive``); the lossy rules need
            ``temperature > 0``.
        temperature: 0 decodes greedily; otherwise the sampling temperature.
        eos_token_id: generation stops after this token (``None``: only at ``max_new_tokens``).
        synthetic_acceptance: conditional α_1, α_2, ... (the last repeats) that replace the target's verdict,
            seeded by ``synthetic_seed`` and the prompt; greedy only (``engine.verify.SyntheticAcceptance``).
            ``None``: the target decides.
        synthetic_seed: the seed of the synthetic draws.
    """

    max_new_tokens: int
    spec: SpeculativeConfig
    temperature: float
    eos_token_id: int | None
    synthetic_acceptance: tuple[float, ...] | None
    synthetic_seed: int

    def __init__(self, max_new_tokens: int, spec: SpeculativeConfig | None = None, *, temperature: float = 0.0,
                 eos_token_id: int | None = None, synthetic_acceptance: tuple[float, ...] | None = None,
                 synthetic_seed: int = 0, **speculative: Any) -> None:
        values = {"max_new_tokens": max_new_tokens, "spec": with_fields(spec, speculative, "DecodeConfig"),
                  "temperature": temperature, "eos_token_id": eos_token_id,
                  "synthetic_acceptance": synthetic_acceptance, "synthetic_seed": synthetic_seed}
        for name, value in values.items():
            object.__setattr__(self, name, value)  # frozen: set once, here
        self._check()

    def _check(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        check_num_speculative(self.spec.num_speculative_tokens)  # a speculative decode drafts: N >= 1
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        rates = self.synthetic_acceptance
        if rates is not None:
            if not rates or any(not 0.0 <= a <= 1.0 for a in rates):
                raise ValueError(f"synthetic acceptance rates must be 1 or more values in [0, 1], got {list(rates)}")
            if self.temperature > 0:
                raise ValueError("synthetic acceptance decodes greedily (temperature 0)")
        if self.spec.acceptance != "exact" and self.temperature == 0:
            raise ValueError(f"acceptance {self.spec.acceptance!r} is a sampling rule; temperature must be > 0")

    @property
    def room(self) -> int:
        """Positions a sequence may need past its prompt: the output, one chain draft, the bonus and one spare."""
        return self.max_new_tokens + self.spec.num_speculative_tokens + 2

    @property
    def plain_room(self) -> int:
        """Positions plain decoding (``autoregressive``) gives its cache past the prompt: the output and one spare."""
        return self.max_new_tokens + 1
