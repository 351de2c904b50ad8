"""Lone UTF-16 surrogates: JSON may spell one (``"\\ud83d"``), Python decodes it into a str that no
tokenizer or UTF-8 writer accepts. Valid pairs decode to one code point, so any surrogate left after
decoding is lone. The line itself is walked only when it holds such an escape (:data:`SURROGATE_ESCAPE`);
a string that holds JSON of its own (a tool call's ``arguments``, a record's ``tools`` given as a JSON
string) is walked once it is parsed, since its escapes are the line's ``\\\\u`` and decode only then.
"""

from __future__ import annotations

import re
from typing import Any

from packer.errors import BadRecord

SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
SURROGATE = re.compile("[\ud800-\udfff]")


def check_strings(obj: Any, where: str = "") -> None:
    """Raise ``invalid_id`` / ``invalid_text`` for the first key or string of ``obj`` holding a lone surrogate;
    ``where`` names ``obj`` in the record (empty: ``obj`` is the record)."""
    stack: list[tuple[str, Any]] = [(where, obj)]
    while stack:  # iterative: a record nested to the JSON decoder's limit would overflow a recursive walk
        at, value = stack.pop()
        if isinstance(value, str):
            bad = SURROGATE.search(value)
            if bad:
                code = f"U+{ord(bad.group()):04X}"
                if at == "id" and not where:
                    raise BadRecord("invalid_id", f"'id' holds a lone UTF-16 surrogate ({code}), not valid Unicode; "
                                                  f"fix the id (write the character's full surrogate pair, or drop it)")
                raise BadRecord("invalid_text", f"{at or 'the record'} holds a lone UTF-16 surrogate ({code}) at "
                                                f"character {bad.start()}, not valid Unicode; fix the text (write the "
                                                f"character's full surrogate pair, or drop it)")
        elif isinstance(value, dict):
            for k, v in reversed(value.items()):
                name = f"{at}.{k}" if at else str(k)
                if SURROGATE.search(k):
                    stack.append((f"{at}.<key>" if at else "<key>", k))
                stack.append((SURROGATE.sub("?", name), v))
        elif isinstance(value, list):
            stack.extend((f"{at}[{i}]", v) for i, v in reversed(list(enumerate(value))))
