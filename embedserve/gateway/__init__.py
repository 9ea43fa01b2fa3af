"""The HTTP tier: OpenAI- and TEI-compatible routes over a pool of scheduler replicas.

``create_app(settings)`` (``app.py``) builds the FastAPI app; ``cli.py`` adds
``embedserve gateway`` and ``embedserve serve``. A request flows through
``routes/`` (JSON shapes) -> ``routing.ModelRouter`` (which served model) ->
that model's ``pipeline.Gateway`` (admission, deadline, cancellation) ->
``preprocess`` (prompts, tokenization, limits) ->
``dispatch`` (chunks over ``replicas.ReplicaPool``, retries, reassembly).
Errors are mapped to HTTP once, in ``http_errors``; gRPC failures are
translated in ``embedserve.link.status``. The gateway never loads model weights.
"""
