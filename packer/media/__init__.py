"""Media: how many placeholder positions an image or audio clip occupies, and reading
just enough of each file to know it.

- :mod:`packer.media.policies` -- token-count policies, pure functions of the media's
  size and the policy's parameters, registered by name (``fixed``, ``dynamic``,
  ``anyres`` for images; ``whisper``, ``qwen2-audio``, ``rate`` for audio).
- :mod:`packer.media.probe` -- image size from the header (PIL, lazily) and audio
  duration from the header (soundfile); bad files raise ``BadRecord``.
- :mod:`packer.media.counter` -- the two together, per worker, with a small cache.
- :mod:`packer.media.embed` / :mod:`packer.media.features` -- optional passes that run
  an open_clip vision tower or compute log-mel features (torch imported there only).
"""
