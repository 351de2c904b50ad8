"""Media: how many placeholder positions an image or audio clip occupies, and reading
just enough of each file to know it.

- :mod:`packer.media.policies` -- token-count policies, pure functions of the media's
  size and the policy's parameters, one module each, registered by name (``fixed``,
  ``dynamic``, ``anyres`` for images; ``whisper``, ``qwen2-audio``, ``rate`` for audio;
  ``qwen2vl`` for video).
- :mod:`packer.media.refs` -- the one media-path convention: a record's ref resolved
  against its root (outside-root, remote and inline refs refused), stored relative to the
  build's media root, and joined back onto it when read.
- :mod:`packer.media.probe` -- image size from the header (PIL, lazily, EXIF orientation
  applied) and audio duration from the header (soundfile); bad files raise ``BadRecord``.
- :mod:`packer.media.load` -- the loading convention counts are made for (HF
  ``load_image``: EXIF transpose + RGB; mono 16 kHz audio).
- :mod:`packer.media.counter` -- probes and policies together, per worker, with a small cache.
- :mod:`packer.media.embed` / :mod:`packer.media.features` -- optional passes that run
  an open_clip vision tower (a named hidden state, or pooled) or compute Whisper
  log-mel features with ``WhisperFeatureExtractor`` (heavy imports there only).
"""
