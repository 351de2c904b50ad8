"""Bounds on one chat-template rendering: a number of steps and a number of characters.

A chat template is code shipped with a checkpoint. transformers' sandbox keeps it away from
Python's internals and caps one ``range()`` at 100,000 items, but not what a template does with
them: two nested loops over ``range(99999)`` run 10^10 steps (a build that never ends), and
``{% set ns.s = ns.s ~ ns.s %}`` doubles a string each step (gigabytes in 30 steps). Here a
rendering runs under two bounds, both **counted, not timed**, so the same record is refused on
every machine and under any load (a timed bound would make two builds of the same data differ):

- steps: every loop iteration and every call (a macro, a method, a global) counts one; past
  ``max_steps`` the rendering stops and the record is quarantined as ``template_too_slow``;
- characters: every string or list the template builds (``+ * % ~``, a filter, a method call)
  and the output written so far hold at most ``max_chars`` characters, else
  ``template_output_too_long``. ``*`` of a sequence, ``ljust`` / ``rjust`` / ``center`` / ``zfill``,
  ``replace`` and ``%`` widths are checked before they allocate; an integer holds at most
  ``MAX_INT_BITS`` bits (``9 ** 9 ** 9`` is refused before it is computed).

How: the template's syntax tree is rewritten before compiling, every ``{% for %}`` iterable and
every ``~`` wrapped in a filter of this module; the sandbox's ``call`` and its interceptable binary
operators (``+ * % **``) are overridden on a private overlay of transformers' environment. A
rendering that stays in bounds is unchanged, character for character (``Renderer.check`` compares
it with transformers' own). Measured on the Qwen3 template (2,000 chats, 2 shared cores): see
docs/reliability.md.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Iterable, Iterator
from typing import Any

from packer.errors import BadRecord

MAX_INT_BITS = 1 << 16  # no chat template needs an integer of more than 65,536 bits
_SIZED = (str, list, tuple, bytes, dict)
_GROWING = frozenset({"center", "indent", "wordwrap", "format", "replace", "join", "tojson", "pprint", "batch", "slice",
                      "truncate", "xmlattr", "urlize"})  # filters whose result can outgrow their input
_GROWING_METHODS = frozenset({"ljust", "rjust", "center", "zfill", "expandtabs", "replace"})  # _before_method's
_WIDTH = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\d+|\*)?(?:\.(\d+|\*))?")


class Budget:
    """The steps left to one rendering and the size limit; :meth:`reset` before each rendering."""

    __slots__ = ("max_chars", "max_steps", "steps")

    def __init__(self, max_steps: int, max_chars: int):
        self.max_steps = max_steps
        self.max_chars = max_chars
        self.steps = max_steps

    def reset(self) -> None:
        self.steps = self.max_steps

    def tick(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise self.too_slow()

    def too_slow(self) -> BadRecord:
        return BadRecord("template_too_slow", f"the chat template took more than {self.max_steps:,} steps (loop "
                                                 f"iterations and calls) on this record; a template that loops without "
                                                 f"end, or a record far larger than the rest: raise template_max_steps "
                                                 f"if it is legitimate")

    def too_long(self, n: int) -> BadRecord:
        return BadRecord("template_output_too_long", f"the chat template built a text of {n:,} characters or items on "
                                                     f"this record, over template_max_chars = {self.max_chars:,}; raise "
                                                     f"it if the record is legitimate")

    def sized(self, value: Any) -> Any:
        """``value``, if it is within the size bounds."""
        if type(value) is str:  # the common case, first
            if len(value) > self.max_chars:
                raise self.too_long(len(value))
        elif isinstance(value, _SIZED):
            if len(value) > self.max_chars:
                raise self.too_long(len(value))
        elif isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise BadRecord("template_output_too_long", f"the chat template computed an integer of "
                                                        f"{value.bit_length():,} bits on this record")
        return value

    def room(self, n: int) -> None:
        """Refuse before building something of ``n`` characters / items."""
        if n > self.max_chars:
            raise self.too_long(n)


def bound(env: Any, source: str, budget: Budget):
    """``source`` compiled in ``env`` (a private overlay of transformers' sandbox) under ``budget``."""
    from jinja2 import nodes
    from jinja2.sandbox import SandboxedEnvironment

    filters = env.filters = dict(env.filters)  # an overlay shares its parent's dicts: copy before adding
    env.globals = dict(env.globals)
    filters["packer_loop"] = functools.partial(_loop, budget)
    filters["packer_sized"] = budget.sized
    for name in _GROWING & set(filters):  # the others give at most what they are given (checked where it is used)
        filters[name] = _sized_filter(filters[name], name, budget)
    base_call = env.call
    base_binop = env.call_binop
    sized = budget.sized
    # '+' of two ints or two strs is the operator itself where the sandbox's binop is (jinja's default)
    plain_add = (getattr(type(env), "call_binop", None) is SandboxedEnvironment.call_binop
                 and env.binop_table.get("+") is operator.add)

    def call(context, obj, /, *args, **kwargs):
        budget.steps -= 1  # Budget.tick, inlined: a call's own cost is most of a small template's overhead
        if budget.steps < 0:
            raise budget.too_slow()
        if args and getattr(obj, "__name__", None) in _GROWING_METHODS:
            _before_method(obj, args, budget)
        return sized(base_call(context, obj, *args, **kwargs))

    def call_binop(context, op, left, right):
        if op == "+" and plain_add:
            kind = type(left)
            if kind is type(right):
                if kind is int:
                    return left + right  # the common case (loop.index0 + 1): one bit of growth at most
                if kind is str:  # a turn's text joined: checked before it is built, as _before_binop does
                    if len(left) + len(right) > budget.max_chars:
                        raise budget.too_long(len(left) + len(right))
                    return left + right
        _before_binop(op, left, right, budget)
        return sized(base_binop(context, op, left, right))

    env.call = call
    env.call_binop = call_binop
    env.intercepted_binops = frozenset({"+", "*", "%", "**"})
    # jinja2's optimizer folds constant expressions while compiling -- '{{ "%999999999d" % 1 }}' would build its
    # gigabyte before any check runs: compiled unoptimized, every operation runs through the checks above
    env.optimized = False
    tree = env.parse(source)
    for node in tree.find_all(nodes.For):
        node.iter = nodes.Filter(node.iter, "packer_loop", [], [], None, None, lineno=node.lineno)
    for node in list(tree.find_all(nodes.Concat)):
        _wrap_concat(tree, node)
    return env.from_string(tree)


def _wrap_concat(tree: Any, target: Any) -> None:
    """Replace ``target`` (a ``~`` expression) in its parent by ``target | packer_sized``."""
    from jinja2 import nodes

    for parent in tree.find_all(nodes.Node):
        for field in parent.fields:
            value = getattr(parent, field, None)
            if value is target:
                setattr(parent, field, nodes.Filter(target, "packer_sized", [], [], None, None, lineno=target.lineno))
                return
            if isinstance(value, list):
                for k, item in enumerate(value):
                    if item is target:
                        value[k] = nodes.Filter(target, "packer_sized", [], [], None, None, lineno=target.lineno)
                        return


def _loop(budget: Budget, iterable: Iterable) -> Iterator:
    for item in iterable:
        budget.steps -= 1  # Budget.tick, inlined
        if budget.steps < 0:
            raise budget.too_slow()
        yield item


def _sized_filter(f: Any, name: str, budget: Budget) -> Any:
    @functools.wraps(f)  # keeps jinja's pass_context / pass_environment marks
    def checked(*args, **kwargs):
        if name in ("center", "indent", "wordwrap", "truncate") and len(args) > 1 and isinstance(args[-1], int):
            budget.room(args[-1])  # a width: center(10**9) would allocate it
        if name == "format" and args and isinstance(args[0], str):
            _before_binop("%", args[0], tuple(args[1:]), budget)
        return budget.sized(f(*args, **kwargs))
    return checked


def _before_method(obj: Any, args: tuple, budget: Budget) -> None:
    owner = getattr(obj, "__self__", None)
    if not isinstance(owner, str) or not args:
        return
    name = getattr(obj, "__name__", "")
    if name in ("ljust", "rjust", "center", "zfill") and isinstance(args[0], int):
        budget.room(args[0])
    elif name == "expandtabs" and isinstance(args[0], int):
        budget.room(len(owner) + owner.count("\t") * args[0])
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        count = owner.count(args[0]) if args[0] else len(owner) + 1
        budget.room(len(owner) + count * max(len(args[1]) - len(args[0]), 0))


def _before_binop(operator: str, left: Any, right: Any, budget: Budget) -> None:
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, _SIZED) and isinstance(n, int):
                budget.room(len(seq) * n)
    elif operator == "+" and isinstance(left, _SIZED) and isinstance(right, _SIZED):
        budget.room(len(left) + len(right))
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
        if right * abs(left).bit_length() > MAX_INT_BITS * 2:
            budget.sized(1 << (MAX_INT_BITS + 1))  # refused as too large, without computing it
    elif operator == "%" and isinstance(left, str):
        for m in _WIDTH.finditer(left):
            for width in m.groups():
                if width and width != "*":
                    budget.room(int(width))
        if "*" in left:  # '%*s' % (10**9, x): the width is a value
            for v in right if isinstance(right, tuple) else (right,):
                if isinstance(v, int):
                    budget.room(abs(v))
