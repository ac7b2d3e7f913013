"""The peers' walk over nested data: Lightning's ``apply_to_collection``, accelerate's ``recursively_apply``.

Both rebuild dicts (in their own key order), lists, tuples and namedtuples around new leaves; so
does :func:`map_leaves`, which the compat modules share.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["map_leaves", "flat_leaves"]


def map_leaves(data: Any, leaf: Callable[[Any], Any]) -> Any:
    """``data`` with every leaf (anything but a dict, list or tuple) replaced by ``leaf(x)``, structure kept."""
    if isinstance(data, dict):
        return type(data)((k, map_leaves(v, leaf)) for k, v in data.items())
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(map_leaves(v, leaf) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(map_leaves(v, leaf) for v in data)
    return leaf(data)


def flat_leaves(data: Any) -> list[Any]:
    """Every leaf of ``data``, in :func:`map_leaves` order."""
    out: list[Any] = []
    map_leaves(data, out.append)
    return out
