"""``packer verify OUT``: is this build intact and internally consistent?

Checks, naming the file (and row) of every problem found:

- the manifest: a finished build of a known schema version;
- every file it lists (samples, plan, packed, quarantine, dropped, tokenizer, report,
  media index, embeddings, features): present, same size and sha256, the Arrow schema
  version, the row count;
- every other file of the folder: none but ``manifest.json``, the lock and ``.state/`` (an
  extra shard, a stray file, a left-over ``internal_error.json`` is a problem); ``.state/``
  may be absent (a finished build needs no resume journal), and where present holds only
  the fingerprint and journal entries, with a fingerprint that agrees with the manifest
  (config, tokenizer, media root);
- with ``--media`` (``stat``, the default, or ``hash``): every media file of the media
  index (``media.arrow``) against what the build recorded -- present, same size and
  modification time (``stat``; size only under another ``--media-root``, since a copy
  changes the time), or same sha256 (``hash``, for a build made with ``--media-hash``);
- every packed row: ``cu_seqlens`` starts at 0, increases, ends at ``n_tokens`` = the
  number of ids and labels; ``n_tokens <= max_length`` (a source's own where it has one, the row of one
  policy's sources only, one sample a row of a source with ``packing = false``); one id, modality, parent, group, role
  and weight per segment; labels -100 at every segment start and on every placeholder / begin /
  end token; media spans inside their segment, starting and ending with their kind's
  placeholder id and holding ``tokens`` of them, and no placeholder id outside a span;
- preference records in a row: a record's segments consecutive (its group), of one input
  line; a parent an earlier segment of the group, a tree's ``prompt`` (untrained, holding the
  record's media: no media in a branch), its branches starting with one same token; a
  ``chosen`` with exactly one ``rejected`` in its group;
- with ``--collate``: every row can be collated for the build's family, judged from its stored spans without
  loading a pixel (:meth:`packer.families.Family.row_problem`: LLaVA-OneVision's videos of one frame count);
- the accounting: records read = packed + quarantined + dropped, per file and in total;
  the quarantine and ``dropped.jsonl`` have one line per record they count; the packed
  rows hold every packed sample, counted by integer identity (input file, line; pieces
  of a split sample once, duplicate ids harmless) and the manifest's rows and tokens.

A manifest that is missing, damaged or of another schema version is a problem like any
other (exit code 6), never a traceback; so is a damaged shard: every Arrow file is validated
before a row is read (:mod:`packer.shards.integrity`) and named on one line, and the rows of a
file whose sha256 differs are not checked one by one. ``--deep`` (:mod:`packer.verify.deep`)
re-derives the plan from the samples' lengths and the manifest's plan settings, the packed rows from the
samples and the plan, and the manifest's tokenizer record from ``tokenizer/``, and compares them; what no
file of the build re-derives (the code version, stage 1's settings) it names as not checkable.

The package: :mod:`~packer.verify.problem` (what every check returns), :mod:`~packer.verify.files` (the manifest's
files, the folder, the media, the accounting), :mod:`~packer.verify.rows` (every packed row against the format's
invariants, :mod:`packer.shards.invariants`), :mod:`~packer.verify.deep` (``--deep``),
:mod:`~packer.verify.against_processor` (``--against-processor``) and :mod:`~packer.verify.check` (the run, in order).
"""

from packer.verify.check import verify, verify_or_raise
from packer.verify.problem import Problem

__all__ = ["Problem", "verify", "verify_or_raise"]
