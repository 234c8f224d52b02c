"""`/models/{name}/...`: every route of ours and TEI's for the model `name`, so that each TEI or Hugging Face client
points at one model of several by its base URL, unchanged; `POST /models/{name}` is that model's root task, as the
Hugging Face Inference API's own URLs are.

An ASGI middleware (the app's outermost) takes the prefix off the path and puts the model's name in the request's
scope (PATH_MODEL_SCOPE), where the routes' dependencies find it (service.frontend.deps): below it, every guard, metric
and route sees the path without the prefix and serves the model named. A name no model has (or none) gets 404 in
the error shape of the route it was meant for, naming the served models.

MODEL_SCOPE holds the model a request is for, as far as is known: the path's, else the default for a computing
route (the OpenAI route may still pick another from its body). Admission counts by it and metrics label by it.
"""

from __future__ import annotations

from service.errors import ServiceError
from service.frontend.http_errors import error_response

MODEL_SCOPE = "bert.model"
PATH_MODEL_SCOPE = "bert.path_model"
PREFIX = "/models/"


def split_model_path(path: str) -> tuple[str, str] | None:
    """'/models/NAME/rest' -> ('NAME', '/rest'); '/models/NAME' -> ('NAME', '/'); other paths -> None."""
    if not path.startswith(PREFIX):
        return None
    name, _, rest = path[len(PREFIX):].partition("/")
    return name, "/" + rest


class ModelPrefix:
    def __init__(self, app, runtime, api_routes: frozenset[str]):
        self.app = app
        self.runtime = runtime
        self.api_routes = api_routes  # the computing routes: for the default model when the path names none

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or MODEL_SCOPE in scope:
            return await self.app(scope, receive, send)
        split = split_model_path(scope["path"])
        if split is None:
            if scope["path"] in self.api_routes:
                scope = {**scope, MODEL_SCOPE: self.runtime.default}
            return await self.app(scope, receive, send)
        name, rest = split
        try:
            if not name:
                raise ServiceError("not_found", f"no model named in the path; the served models: "
                                   f"{', '.join(self.runtime.models)} (/models/NAME/...)")
            model = self.runtime.model(name)
        except ServiceError as exc:
            return await error_response(exc.kind, exc.message, rest, param="model")(scope, receive, send)
        scope = {**scope, "path": rest, "raw_path": rest.encode(), MODEL_SCOPE: model.name, PATH_MODEL_SCOPE: model.name}
        return await self.app(scope, receive, send)
