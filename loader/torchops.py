"""``torch.ops.<ns>.<op>``, ``.default`` and ``.out`` through the fast entry.

torch's :class:`~torch._ops.OpOverloadPacket` and :class:`~torch._ops.OpOverload` are Python classes: every call
runs a Python ``__call__`` before the C++ callable boxes the arguments for the dispatcher. For an op the fast entry
serves (:func:`flyship.loader.handles._fast_entry_fits`), the loader swaps the class of its packet and overloads
(``obj.__class__ = ...``) for :class:`FastOpOverloadPacket` / :class:`FastOpOverload`: subclasses of torch's with
``__slots__ = ()`` and nothing of their own in Python, whose C ``tp_call`` (csrc/torch_op_call.cpp) runs a call
through the C++ core when the fast rule takes it (the rule the handles use: plain tensors, no mode, no autograd
graph needed, ...) and hands every other call to torch's own ``__call__`` with the same arguments. The objects stay
the ones torch made (``torch.ops.<ns>.add.default is ops.add.default``); ``isinstance`` and every Python attribute
are torch's, so torch.compile, make_fx, torch.export and ``opcheck`` see an ordinary op.

A class is swapped only when the object's type is exactly torch's (never a subclass someone else made), and nothing
is swapped with ``FLYSHIP_FAST_CALL=0``.
"""

from __future__ import annotations

from typing import Any

import torch


class FastOpOverloadPacket(torch._ops.OpOverloadPacket):
    """torch's packet with calls through the fast entry (csrc/torch_op_call.cpp); nothing else differs."""

    __slots__ = ()


class FastOpOverload(torch._ops.OpOverload):
    """torch's overload with calls through the fast entry (csrc/torch_op_call.cpp); nothing else differs."""

    __slots__ = ()


# Per extension (its FastCall type): the classes whose tp_call is that extension's entry. Two extensions may sit in
# one process (the recording driver beside a GPU flavor); each binds its own ops to its own classes.
_classes: dict[int, tuple[type, type]] = {}


def fast_classes(ext: Any) -> tuple[type, type]:
    """The packet and overload classes whose eager calls enter extension ``ext``'s fast entry."""
    key = id(ext.FastCall)
    if key not in _classes:
        packet = type("FastOpOverloadPacket", (FastOpOverloadPacket,), {"__slots__": (), "__module__": __name__})
        overload = type("FastOpOverload", (FastOpOverload,), {"__slots__": (), "__module__": __name__})
        ext.enable_torch_op_call(packet)
        ext.enable_torch_op_call(overload)
        _classes[key] = (packet, overload)
    return _classes[key]


def bind(ext: Any, core: Any, index: int, packet: Any, defaults: list[Any]) -> int:
    """Bind op ``index`` of ``core``'s torch packet ``packet``, its ``.default`` and its ``.out`` to the fast entry.

    Args:
        ext: the loader extension (its ``FastCall``, ``bind_fast``, ``bind_torch_op``, ``enable_torch_op_call``).
        core: the bundle's C++ core.
        index: the op's index in the bundle.
        packet: ``torch.ops.<ns>.<op>``.
        defaults: per input, the scalar default, or None.

    Returns:
        How many of the three objects were bound (one whose type is not exactly torch's class is left alone).
    """
    packet_cls, overload_cls = fast_classes(ext)
    bound = 0
    for obj, is_out, torch_cls, cls in ((packet, False, torch._ops.OpOverloadPacket, packet_cls),
                                        (packet.default, False, torch._ops.OpOverload, overload_cls),
                                        (packet.out, True, torch._ops.OpOverload, overload_cls)):
        if type(obj) is not torch_cls:
            continue
        binding = ext.FastCall()
        ext.bind_fast(binding, core, index, is_out, obj, defaults, True)
        ext.bind_torch_op(obj, binding)  # before the swap: the class's C tp_call reads it
        obj.__class__ = cls
        bound += 1
    return bound
