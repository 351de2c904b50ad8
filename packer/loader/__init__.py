"""The runtime loader: packed shards -> batches any trainer can use. Imports torch.

    from packer.loader import PackedDataset, PackedCollator, TokenBalancedSampler, model_inputs, packed_loss
    ds = PackedDataset("out/qwen3vl")
    collate = PackedCollator.for_build(ds, model)   # attention, rope, family, processor: from the build and the model
    sampler = TokenBalancedSampler(ds, num_replicas=world, rank=rank, batch_size=1, seed=0)
    loader = DataLoader(ds, batch_size=1, sampler=sampler, collate_fn=collate, num_workers=4)
    for batch in loader:
        loss = packed_loss(model(**model_inputs(batch)).logits, batch)
"""

from packer.loader.collate import PackedCollator, model_inputs
from packer.loader.dataset import MediaChangedError, PackedDataset, SampleDataset
from packer.loader.dummy import MediaDummies, media_dummies
from packer.loader.logps import ResponseLogps, all_reduce_logps, dpo_loss, packed_logps, token_logps
from packer.loader.loss import StepNorm, loss_norm, loss_weights, packed_loss
from packer.loader.media import MediaMismatchError
from packer.loader.samplers import CostModel, SplitModalitySampler, StepPlanSampler, TokenBalancedSampler
from packer.loader.sequence_parallel import local_media_rows, shard_for_sequence_parallel
from packer.loader.sp_attention import SequenceParallel
from packer.loader.sp_media import shared_encoders
from packer.loader.stored import StoredFeatures
from packer.loader.text_batch import ATTENTION
from packer.media.load import MediaLoadError
from packer.modeling.mrope import mrope_positions


def __getattr__(name: str):
    if name == "PackedTrainer":  # imports transformers' Trainer (and Accelerate): only when asked for
        from packer.loader.trainer import PackedTrainer

        return PackedTrainer
    raise AttributeError(f"module 'packer.loader' has no attribute {name!r}")


__all__ = ["ATTENTION", "CostModel", "MediaChangedError", "MediaDummies", "MediaLoadError", "MediaMismatchError",
           "PackedCollator", "PackedDataset", "PackedTrainer", "ResponseLogps", "SampleDataset", "SequenceParallel",
           "SplitModalitySampler", "StepNorm",
           "StepPlanSampler",
           "StoredFeatures", "TokenBalancedSampler", "all_reduce_logps", "dpo_loss", "local_media_rows", "loss_norm",
           "loss_weights", "media_dummies", "model_inputs", "mrope_positions", "packed_logps", "packed_loss",
           "shard_for_sequence_parallel", "shared_encoders", "token_logps"]
