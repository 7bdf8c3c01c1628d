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
(:func:`module_tensors`). And a walk (:mod:`.walker`): breadth first from named roots, each
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

from gpumagic.namespace import rules as _rules
from gpumagic.namespace import walker as _walker
from gpumagic.namespace.rules import IPYTHON_NAMES as IPYTHON_NAMES
from gpumagic.namespace.rules import SMALL as SMALL
from gpumagic.namespace.rules import attributes as attributes
from gpumagic.namespace.rules import history as history
from gpumagic.namespace.rules import instance_dict as instance_dict
from gpumagic.namespace.rules import is_a as is_a
from gpumagic.namespace.rules import is_user_name as is_user_name
from gpumagic.namespace.rules import key_text as key_text
from gpumagic.namespace.rules import module_tensors as module_tensors
from gpumagic.namespace.rules import own_tensors as own_tensors
from gpumagic.namespace.rules import small_items as small_items
from gpumagic.namespace.rules import small_values as small_values
from gpumagic.namespace.rules import submodules as submodules
from gpumagic.namespace.rules import type_name as type_name
from gpumagic.namespace.rules import user_items as user_items
from gpumagic.namespace.walker import DEEP as DEEP
from gpumagic.namespace.walker import DEPTH as DEPTH
from gpumagic.namespace.walker import ITEMS as ITEMS
from gpumagic.namespace.walker import OBJECTS as OBJECTS
from gpumagic.namespace.walker import Reached as Reached
from gpumagic.namespace.walker import Walk as Walk
from gpumagic.namespace.walker import reachable_tensors as reachable_tensors
from gpumagic.namespace.walker import walk as walk

# what the two modules offer, and nothing else
__all__ = [*_rules.__all__, *_walker.__all__]
