"""Tool calling in chat records: an assistant turn's ``tool_calls``, a tool turn's ids, the record's ``tools``.

They reach the chat template as ``tokenizer.apply_chat_template(messages, tools=tools)`` passes them: the
message keys stay on the message dict (``tool_calls`` on the assistant turn, ``tool_call_id`` / ``name`` on the
tool turn that answers it), the record's top-level ``tools`` (JSON schemas; a JSON string of them too, as TRL
reads its ``tools`` column) is the template's ``tools`` variable. One normalisation, to the form transformers
documents and templates read: a call's ``function.arguments`` written as a JSON string (OpenAI's wire format)
is parsed into its object, so a template's ``arguments | tojson`` writes it once, not as a quoted string (a lone
surrogate its JSON spells is then ``invalid_text``, as anywhere in the line). An
assistant turn that only calls tools may have ``"content": null`` (OpenAI's): it is rendered as ``""``.

What is trained follows the roles: an assistant turn's tool calls are its own emission (trained, with its
content and the template's end of turn); a tool turn's result never is.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from packer.errors import BadRecord
from packer.ingest.unicode import check_strings

MESSAGE_KEYS = ("tool_calls", "tool_call_id", "name")  # kept on a message for the template, when given


def message_fields(m: dict[str, Any], where: str) -> tuple[tuple[str, Any], ...]:
    """The tool keys of message ``m`` as (key, value) pairs, checked; ``tool_calls`` only on an assistant turn."""
    out = []
    for key in MESSAGE_KEYS:
        value = m.get(key)
        if value is None:
            continue
        if key == "tool_calls":
            if m.get("role") != "assistant":
                raise BadRecord("wrong_type", f"{where}.tool_calls is on a {m.get('role')!r} turn; only an assistant "
                                              f"turn calls tools")
            value = _calls(value, f"{where}.tool_calls")
        elif not isinstance(value, str):
            raise BadRecord("wrong_type", f"{where}.{key} must be a string, got {type(value).__name__}")
        out.append((key, value))
    return tuple(out)


def _calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list) or not calls:
        raise BadRecord("wrong_type", f"{where} must be a non-empty list of calls")
    out = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise BadRecord("wrong_type", f"{where}[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\", "
                                          f"\"arguments\"}}}}")
        arguments = function.get("arguments")
        if isinstance(arguments, str):  # OpenAI's JSON string: the object transformers' templates expect
            parsed = _loads(arguments, f"{where}[{i}].function.arguments", "")
            if isinstance(parsed, dict):
                call = {**call, "function": {**function, "arguments": parsed}}
        out.append(call)
    return out


def record_tools(obj: dict[str, Any]) -> tuple[dict[str, Any], ...] | None:
    """The record's ``tools`` (a list of JSON schemas, or that list as a JSON string); None when it has none."""
    tools = obj.get("tools")
    if tools is None:
        return None
    if isinstance(tools, str):
        tools = _loads(tools, "tools", " (a list of tool schemas)")
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise BadRecord("wrong_type", f"'tools' must be a list of tool schemas (objects), got {type(tools).__name__}")
    return tuple(tools) or None


def _loads(text: str, where: str, what: str) -> Any:
    """The JSON a string field holds, refused as the line itself would be: not JSON (``wrong_type``), an integer
    past Python's digit limit (``number_too_large``), nesting past the recursion limit (``nesting_too_deep``), a
    lone surrogate its escapes spell (``invalid_text``: they decode only here, not with the line)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise BadRecord("nesting_too_deep", f"{where} is JSON nested deeper than Python's recursion limit "
                                            f"({sys.getrecursionlimit()}); flatten it") from None
    except json.JSONDecodeError as e:
        raise BadRecord("wrong_type", f"{where} is a string that is not JSON{what} ({e.msg}, column {e.colno}): "
                                      f"{text[:40]!r}") from None
    except ValueError as e:  # Python refuses to convert integers over sys.get_int_max_str_digits() digits
        raise BadRecord("number_too_large", f"{where} holds an integer too long to read ({e})") from None
    check_strings(value, where)
    return value
