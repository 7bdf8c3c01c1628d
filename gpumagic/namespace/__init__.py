"""The user's namespace, read without touching what it holds: one set of rules about what is
safe to read, and one walker, for every scanner of the package (the tensor census, the
out-of-memory report, the dry run, ``%%gpuprofile``'s session facts).

A namespace holds whatever the user put there: lazy proxies whose ``__class__`` raises or
lies, objects whose ``__getattr__`` fetches from a server, properties that compute,
containers of a million items, objects whose ``__eq__``, ``__hash__``, ``__len__``,
``__iter__`` or ``__bool__`` raise. A cell behaves as it would without the magic, so reading
the namespace runs none of that. The rules (:mod:`.rules`):

* an object's kind is ``type(obj)``, never ``obj.__class__``, which ``isinstance`` consults
  after the real type and which a proxy may make raise or lie (:func:`is_a`);
* attributes are read from the instance's ``__dict__`` and its slots through the built-in
  descriptors the object's class inherits, never by ``getattr``: no property, no descriptor
  of the user's, no ``__getattr__`` runs, and an object whose class defines its own
  ``__dict__`` is not looked into (:func:`attributes`);
* containers (lists, tuples, dicts, sets and their subclasses) are read through the built-in
  type's own methods (``list.__len__``, ``dict.items``), so no override runs, and only up to
  a bound;
* user objects are never compared, hashed, sized, iterated or tested for truth: what was
  seen is remembered by ``id()``;
* IPython's own names (``In``, ``Out``, ``exit``, ``quit``, ``get_ipython``) and private
  names (``_`` and the rest of the output history, ``_i1``...) are not the user's
  (:func:`user_items`); what the output history keeps alive is read apart
  (:func:`history`).

Two depths of reading. One level, on the census's hot path at every statement boundary: a
name's value and the items of a small list, tuple or dict (:data:`SMALL`,
:func:`small_values`, :func:`small_items`), a model's parameters and buffers by name
(:func:`module_tensors`). And a walk (:mod:`.walk`): breadth first from named roots, each
object once, each with a path naming how it was reached (``trainer.model.fc.weight``,
``opt.state[model.fc.weight]['exp_avg']``, ``Cfg.w``, ``mylib.BUF``), bounded in depth, in
items per container and in objects overall, and saying when a bound cut it. With
``through_code`` the walk also goes where code reaches: the globals, closure cells and
defaults of functions, the attributes of classes (and of their bases and modules), the
globals of modules, for the user's own code only (the notebook's, or a file outside the
Python installation: a library's globals are not the user's data).
:func:`reachable_tensors` is the question a dry run asks: every real tensor a cell can
reach from its names, each with a path.

Nothing here imports torch: tensors exist only once the user has imported it.
"""

from __future__ import annotations

from gpumagic.namespace.rules import (
    IPYTHON_NAMES,
    SMALL,
    attributes,
    history,
    instance_dict,
    is_a,
    is_user_name,
    key_text,
    module_tensors,
    own_tensors,
    small_items,
    small_values,
    submodules,
    type_name,
    user_items,
)
from gpumagic.namespace.walk import (
    DEEP,
    DEPTH,
    ITEMS,
    OBJECTS,
    Reached,
    Walk,
    reachable_tensors,
    walk,
)

__all__ = [
    "DEEP",
    "DEPTH",
    "IPYTHON_NAMES",
    "ITEMS",
    "OBJECTS",
    "SMALL",
    "Reached",
    "Walk",
    "attributes",
    "history",
    "instance_dict",
    "is_a",
    "is_user_name",
    "key_text",
    "module_tensors",
    "own_tensors",
    "reachable_tensors",
    "small_items",
    "small_values",
    "submodules",
    "type_name",
    "user_items",
    "walk",
]
