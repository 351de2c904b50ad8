"""The runtime loader: packed shards -> batches any trainer can use. Imports torch.

    from packer.loader import PackedDataset, PackedCollator, TokenBalancedSampler
    ds = PackedDataset("out/sample")
    collate = PackedCollator(attention="sdpa", pad_to=ds.max_length)
    sampler = TokenBalancedSampler(ds, num_replicas=world, rank=rank, batch_size=8, seed=0)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, collate_fn=collate)
"""

from packer.loader.collate import ATTENTION, PackedCollator
from packer.loader.dataset import PackedDataset, SampleDataset
from packer.loader.loss import loss_weights, packed_loss
from packer.loader.mrope import mrope_positions
from packer.loader.samplers import CostModel, SplitModalitySampler, TokenBalancedSampler
from packer.loader.sequence_parallel import shard_for_sequence_parallel

__all__ = ["ATTENTION", "CostModel", "PackedCollator", "PackedDataset", "SampleDataset", "SplitModalitySampler",
           "TokenBalancedSampler", "loss_weights", "mrope_positions", "packed_loss", "shard_for_sequence_parallel"]
