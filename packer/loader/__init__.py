"""The runtime loader: packed shards -> batches any trainer can use. Imports torch.

    from packer.loader import PackedDataset, PackedCollator, TokenBalancedSampler, model_inputs, packed_loss
    ds = PackedDataset("out/qwen2vl")
    collate = PackedCollator(attention="sdpa", rope="mrope", pad_to=ds.max_length, processor=processor)
    sampler = TokenBalancedSampler(ds, num_replicas=world, rank=rank, batch_size=1, seed=0)
    loader = DataLoader(ds, batch_size=1, sampler=sampler, collate_fn=collate, num_workers=4)
    for batch in loader:
        loss = packed_loss(model(**model_inputs(batch)).logits, batch)
"""

from packer.loader.collate import ATTENTION, PackedCollator, model_inputs
from packer.loader.dataset import MediaChangedError, PackedDataset, SampleDataset
from packer.loader.logps import ResponseLogps, dpo_loss, packed_logps, token_logps
from packer.loader.loss import loss_weights, packed_loss
from packer.loader.media import MediaMismatchError
from packer.loader.mrope import mrope_positions
from packer.loader.samplers import CostModel, SplitModalitySampler, TokenBalancedSampler
from packer.loader.sequence_parallel import local_media_rows, shard_for_sequence_parallel
from packer.loader.stored import StoredFeatures
from packer.media.load import MediaLoadError

__all__ = ["ATTENTION", "CostModel", "MediaChangedError", "MediaLoadError", "MediaMismatchError", "PackedCollator",
           "PackedDataset", "ResponseLogps", "SampleDataset", "SplitModalitySampler", "StoredFeatures",
           "TokenBalancedSampler", "dpo_loss", "local_media_rows", "loss_weights", "model_inputs", "mrope_positions",
           "packed_logps", "packed_loss", "shard_for_sequence_parallel", "token_logps"]
