"""Distributed samplers (DistributedSampler-compatible): one per file."""

from packer.cost import CostModel
from packer.loader.samplers.split_modality import SplitModalitySampler
from packer.loader.samplers.step_plan import StepPlanSampler
from packer.loader.samplers.token_balanced import TokenBalancedSampler

__all__ = ["CostModel", "SplitModalitySampler", "StepPlanSampler", "TokenBalancedSampler"]
