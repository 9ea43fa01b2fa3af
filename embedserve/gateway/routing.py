"""Which served model a request goes to: the ``model`` it names, or the only one that fits.

Owns the routing rules of a gateway that serves one model or several (each
a ``Gateway`` with its own tokenizer, replicas and token budget):

- a request that names a model goes to the model serving that name (its
  canonical name or an alias); a name nobody serves is ``ModelNotFound``
  (OpenAI's 404 ``model_not_found``); a model that cannot do the route's
  task (an embedder on ``/rerank``) is a 400 saying so;
- a request that names none goes to the only served model that can do the
  task; when there are several, a 400 asks for ``model``.

Knows nothing about HTTP shapes or replicas.
"""

from __future__ import annotations

from collections.abc import Sequence

from embedserve.errors import InvalidInput, ModelNotFound
from embedserve.gateway.pipeline import TASK_NAMES, Gateway
from embedserve.gateway.settings import check_distinct_names
from embedserve.model.tasks import answers


class ModelRouter:
    """The served models by every name they answer to; the first is the default."""

    def __init__(self, gateways: Sequence[Gateway]) -> None:
        if not gateways:
            raise ValueError("a gateway serves at least one model")
        self.gateways = tuple(gateways)
        check_distinct_names([g.served_names for g in self.gateways])
        self._by_name = {name: g for g in self.gateways for name in g.served_names}

    @property
    def served_names(self) -> tuple[str, ...]:
        """Every name a request may use, model by model, each model's canonical name first."""
        return tuple(self._by_name)

    def find(self, name: str) -> Gateway:
        """The model served as ``name``, or ``ModelNotFound``."""
        gateway = self._by_name.get(name)
        if gateway is None:
            raise ModelNotFound(name)
        return gateway

    def route(self, name: str | None, task: str | None) -> tuple[Gateway, str]:
        """The model for a request naming ``name`` (or none) on a route doing ``task``.

        Returns the model and the name its answer carries: the one asked
        for, or the model's canonical name. ``task`` None: any model will do
        (``/tokenize``).
        """
        if name is not None:
            gateway = self.find(name)
            if task is not None:
                gateway.require_task(task)
            return gateway, name
        able = [g for g in self.gateways if task is None or answers(g.task, task)]
        if len(able) == 1:
            return able[0], able[0].model_id
        served = ", ".join(f"`{g.model_id}`" for g in self.gateways)
        if not able:
            raise InvalidInput(f"this route needs {TASK_NAMES[task]}; none is served here "  # type: ignore[index]
                               f"(served: {served})", field="model")
        names = ", ".join(f"`{g.model_id}`" for g in able)
        raise InvalidInput(f"several models can serve this route ({names}); name one in `model`",
                           field="model")
