"""JSON schemas for an API's OpenAPI document, generated from the view models (pydantic), each once, under the
names the API's clients know: the admin API's (admin/openapi.py) and the agent API's (agent_api/openapi.py)."""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter

REF = "#/components/schemas/{model}"
Mode = Literal["validation", "serialization"]


class Components:
    """The schemas the operations refer to, generated from their types as the operations name them. `names`: a
    model's name in the document, where it is not the model's own."""

    def __init__(self, names: Mapping[str, str] | None = None) -> None:
        self.names = dict(names or {})
        self.schemas: dict[str, Any] = {}

    def component(self, name: str) -> str:
        return self.names.get(name, name)

    def add(self, name: str, schema: Any) -> None:
        name, schema = self.component(name), self.clean(schema)
        if self.schemas.setdefault(name, schema) != schema:
            raise ValueError(f"two different schemas named {name}")

    def schema_of(self, body: Any, mode: Mode) -> dict[str, Any]:
        """A JSON schema as it is, a model as a reference to its component, any other type inline."""
        if isinstance(body, Mapping):
            return dict(body)
        if isinstance(body, type) and issubclass(body, BaseModel):
            generated = body.model_json_schema(ref_template=REF, mode=mode)
            for name, schema in generated.pop("$defs", {}).items():
                self.add(name, schema)
            self.add(body.__name__, generated)
            return {"$ref": REF.format(model=self.component(body.__name__))}
        generated = TypeAdapter(body).json_schema(ref_template=REF, mode=mode)
        for name, schema in generated.pop("$defs", {}).items():
            self.add(name, schema)
        return self.clean(generated)

    def clean(self, schema: Any) -> Any:
        """A generated schema without pydantic's `title`s (the names are the components' own), its references
        under the components' names."""
        if isinstance(schema, list):
            return [self.clean(v) for v in schema]
        if not isinstance(schema, dict):
            return schema
        cleaned = {k: self.clean(v) for k, v in schema.items() if not (k == "title" and isinstance(v, str))}
        ref = cleaned.get("$ref")
        if isinstance(ref, str) and ref.startswith(REF.format(model="")):
            cleaned["$ref"] = REF.format(model=self.component(ref.rsplit("/", 1)[1]))
        return cleaned


@dataclass(frozen=True)
class Param:
    """A path or query parameter; `schema` is its JSON schema."""

    name: str
    where: Literal["path", "query"]
    schema: Mapping[str, Any]
    description: str | None = None
    style: str | None = None
    explode: bool | None = None
