"""A build's jobs, above the stages: :mod:`~packer.pipeline.build` (stage 1 and the run),
:mod:`~packer.pipeline.packing` (stages 2 to 4), :mod:`~packer.pipeline.repack`, :mod:`~packer.pipeline.preflight`
(the checks run where a build starts) and :mod:`~packer.pipeline.accounting` (the build's numbers).
``from packer.build import build, repack`` re-exports the entry points."""
