"""``/openapi.json`` describes the stored-response endpoints as they answer: ``GET`` and
``DELETE /v1/responses/{response_id}`` and ``GET .../input_items`` (OpenAI's pagination), each
answer checked against the document's own schema (in-process app, the real SmolLM2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from tests.conftest import settings_for
from tests.fake_api import FakeAPI

LOCAL = {"x-frugal-route": "local"}


def _fits(spec: dict[str, Any], schema: str, answer: Any) -> None:
    root = {"$ref": f"#/components/schemas/{schema}", "components": spec["components"]}
    Draft202012Validator(root).validate(answer)


async def test_get_delete_and_input_items_fit_the_document(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        spec = (await client.get("/openapi.json")).json()
        made = await client.post(
            "/v1/responses",
            json={"model": "gpt-4o-mini", "input": "What is 2 + 2?", "max_output_tokens": 8},
            headers=LOCAL,
        )
        assert made.status_code == 200, made.text
        rid = made.json()["id"]
        got = await client.get(f"/v1/responses/{rid}")
        items = await client.get(f"/v1/responses/{rid}/input_items", params={"limit": 1})
        bad_page = await client.get(f"/v1/responses/{rid}/input_items", params={"order": "up"})
        deleted = await client.delete(f"/v1/responses/{rid}")
        gone = await client.get(f"/v1/responses/{rid}")
    paths = spec["paths"]
    one = paths["/v1/responses/{response_id}"]
    listed = paths["/v1/responses/{response_id}/input_items"]
    assert {"get", "delete"} <= set(one) and "get" in listed
    assert {p["name"] for p in listed["get"]["parameters"]} == {"limit", "order", "after", "before"}
    assert [p["name"] for p in one["parameters"]] == ["response_id"]
    for status, operation in (
        (got.status_code, one["get"]),
        (items.status_code, listed["get"]),
        (bad_page.status_code, listed["get"]),
        (deleted.status_code, one["delete"]),
        (gone.status_code, one["get"]),
    ):
        assert str(status) in operation["responses"], (status, operation["summary"])
    assert (got.status_code, items.status_code, deleted.status_code) == (200, 200, 200)
    assert (bad_page.status_code, gone.status_code) == (400, 404)
    _fits(spec, "Response", got.json())
    _fits(spec, "ResponseInputItems", items.json())
    _fits(spec, "ResponseDeleted", deleted.json())
    assert got.json()["id"] == rid and deleted.json()["deleted"] is True
    assert [item["role"] for item in items.json()["data"]] == ["user"]
    assert bad_page.json()["error"]["param"] == "order"
