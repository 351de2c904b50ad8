"""A chat template compiled once, for the fast rendering path of :class:`packer.encode.render.Renderer`.

The compile works on transformers' own jinja sandbox (its private compiler, its filters and globals) and bounds the
rendering (:mod:`packer.encode.sandbox`); :mod:`packer.encode.render` owns the public reference call and the
start-up check that the two render alike. Kept apart from it because this is the part that reaches into
transformers' and jinja's internals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from packer.encode.sandbox import Budget, bound

_JSON = (str, dict, list, tuple, int, float, bool, type(None))  # what messages and special tokens are made of


def compile_template(source: str, budget: Budget):
    """The template as transformers compiles it (its sandbox, filters and globals), in an overlay
    of that environment whose attribute check is memoised for plain values; None when
    transformers' private compiler is not there (every render then takes the public path).

    The immutable sandbox asks ``is_safe_attribute(obj, attr, value)`` at every attribute a
    template reads (``message.content``, ``content.startswith``, ...): ~10 µs each, a third of
    a Qwen3 render. Its answer is a function of ``type(obj)`` and ``attr`` alone for the builtin
    types messages are made of and jinja's own loop and namespace objects, so it is computed
    once per (type, attribute) for those; anything else is asked every time. The overlay is
    this module's own: transformers' cached environment is left as it is."""
    try:
        from jinja2.runtime import LoopContext
        from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment
        from jinja2.utils import Namespace
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        return None
    # transformers' environment, as it builds one for every template: taken from the empty template's, so the
    # user's template is never compiled by its optimizer, which folds constants ('%999999999d' % 1) unchecked
    shared = _compile_jinja_template("").environment
    known = (SandboxedEnvironment.is_safe_attribute, ImmutableSandboxedEnvironment.is_safe_attribute)
    if type(shared).is_safe_attribute not in known:
        return bound(shared.overlay(), source, budget)  # a sandbox whose check may depend on the value: not memoised
    namespace = shared.globals.get("namespace")  # transformers' own Namespace subclass
    plain = frozenset({*_JSON, LoopContext, Namespace, *([namespace] if isinstance(namespace, type) else [])})
    env = shared.overlay()
    check: Callable = env.is_safe_attribute
    memo: dict = {}

    def is_safe_attribute(obj: Any, attr: str, value: Any) -> bool:
        kind = type(obj)
        if kind not in plain:
            return check(obj, attr, value)
        hit = memo.get((kind, attr))
        if hit is None:
            hit = memo[kind, attr] = check(obj, attr, value)
        return hit

    env.is_safe_attribute = is_safe_attribute
    if type(shared).getattr is SandboxedEnvironment.getattr:
        env.getattr = _dict_getattr(env)
    return bound(env, source, budget)


_DICT_NAMES = frozenset(dir(dict))


def _dict_getattr(env: Any) -> Callable:
    """The sandbox's ``getattr`` (``message.role``), with a message's key read directly: for a plain dict, Python's
    ``getattr`` fails (raising and catching an AttributeError, ~1 µs, at each of a render's ~25 reads) for every
    name that is not a dict method, and the sandbox then returns the item, or undefined. The same answer here,
    without the exception; every other object goes through the sandbox as before."""
    base = env.getattr
    undefined = env.undefined

    def getattr_(obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_NAMES:
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return undefined(obj=obj, name=attribute)
        return base(obj, attribute)
    return getattr_
