"""What a packed row costs a training step, and where its coefficients come from.

- :mod:`packer.cost.model` -- :class:`CostModel` (a row's cost, linear in its statistics; its three parts
  :data:`COSTS`), loading a cost model JSON, and the build's ``cost_model`` setting resolved
  (:func:`resolve_cost_model`).
- :mod:`packer.cost.flops` -- the coefficients in FLOPs for a model config (``CostModel.for_model``), with the
  derivation; a tower the ViT formula misses is told by what its config declares (:data:`~packer.cost.flops.TOWER_FLOPS`).
- :mod:`packer.cost.calibrate` -- ``packer calibrate``: coefficients fitted to a model's measured step.
"""

from packer.cost.model import AUTO, COSTS, DEFAULT, KINDS, CostModel, CostModelError, resolve_cost_model

__all__ = ["AUTO", "COSTS", "DEFAULT", "KINDS", "CostModel", "CostModelError", "resolve_cost_model"]
