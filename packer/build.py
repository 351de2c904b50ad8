"""``packer build`` and ``packer repack`` as library calls: ``from packer.build import build, repack``.

The work lives in :mod:`packer.pipeline` (build, packing, repack, preflight, accounting); this module keeps the
import path the docs and users know.
"""

from packer.pipeline.accounting import _count_outcomes, _stats, check_bad_fraction, plan_stats
from packer.pipeline.build import SMALL_INPUT_BYTES, auto_workers, build, encode_inputs, media_models, save_tokenizer
from packer.pipeline.encoded import Encoded
from packer.pipeline.packing import check_row_keys, plan_and_pack, write_dropped
from packer.pipeline.preflight import check_output_outside_inputs, check_plan_options, preflight
from packer.pipeline.repack import _link_or_copy, _repack_into, repack

__all__ = ["SMALL_INPUT_BYTES", "Encoded", "_count_outcomes", "_link_or_copy", "_repack_into", "_stats", "auto_workers",
           "build", "check_bad_fraction", "check_output_outside_inputs", "check_plan_options", "check_row_keys",
           "encode_inputs", "media_models", "plan_and_pack", "plan_stats", "preflight", "repack", "save_tokenizer",
           "write_dropped"]
