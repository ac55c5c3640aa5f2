"""`/v1/embeddings` end to end with the `openai` package against a vLLM-shaped embedding model
(tests/models/openai_embed): one and many inputs, token ids, floats and base64, `dimensions`
where the model allows them, usage, listing, and clear errors."""

import base64

import numpy as np
import openai
import pytest


def embed(text, n=8):
    """The test model's embedding (tests/models/openai_embed/1/model.py), computed here."""
    h = sum((k + 1) * ord(c) for k, c in enumerate(text))
    return [((h * (i + 3)) % 997) / 997.0 - 0.5 for i in range(n)]


@pytest.fixture(scope="module")
def oa(server):
    server.wait_models(["openai_embed", "tiny_llm"])
    return openai.OpenAI(
        base_url=f"http://127.0.0.1:{server.openai_port}/v1", api_key="unused", max_retries=0, timeout=60
    )


def test_one_string_as_floats_with_usage(oa):
    r = oa.embeddings.create(model="openai_embed", input="the food was delicious", encoding_format="float")
    assert r.object == "list" and r.model == "openai_embed"
    assert len(r.data) == 1 and r.data[0].index == 0 and r.data[0].object == "embedding"
    assert r.data[0].embedding == pytest.approx(embed("the food was delicious"))
    assert (r.usage.prompt_tokens, r.usage.total_tokens) == (4, 4)


def test_many_inputs_and_token_ids_in_order(oa):
    r = oa.embeddings.create(model="openai_embed", input=["a b", "c", "d e f"])
    assert [d.index for d in r.data] == [0, 1, 2]
    assert [d.embedding for d in r.data] == [pytest.approx(embed(t)) for t in ("a b", "c", "d e f")]
    assert r.usage.prompt_tokens == 6
    r = oa.embeddings.create(model="openai_embed", input=[5, 6, 7])
    assert r.data[0].embedding == pytest.approx(embed("5 6 7"))
    assert r.usage.prompt_tokens == 3
    r = oa.embeddings.create(model="openai_embed", input=[[1, 2], [3]])
    assert [d.embedding for d in r.data] == [pytest.approx(embed("1 2")), pytest.approx(embed("3"))]


def test_base64_is_little_endian_float32(oa):
    r = oa.embeddings.with_raw_response.create(model="openai_embed", input="x y", encoding_format="base64")
    body = r.http_response.json()
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert np.frombuffer(raw, dtype="<f4").tolist() == pytest.approx(embed("x y"), abs=1e-6)
    # The client decodes base64 itself when it asked for floats: the same numbers.
    r = oa.embeddings.create(model="openai_embed", input="x y")
    assert r.data[0].embedding == pytest.approx(embed("x y"), abs=1e-6)


def test_dimensions_where_the_model_allows_them(oa):
    r = oa.embeddings.create(model="openai_embed", input="hello", dimensions=3)
    assert r.data[0].embedding == pytest.approx(embed("hello", 3))
    with pytest.raises(openai.BadRequestError) as e:
        oa.embeddings.create(model="openai_embed", input="hello", dimensions=64)
    assert "at most 8" in e.value.message


def test_embedding_models_are_listed_and_errors_are_openai_shaped(oa):
    ids = {m.id for m in oa.models.list()}
    assert {"openai_embed", "tiny_llm"} <= ids
    assert oa.models.retrieve("openai_embed").id == "openai_embed"
    with pytest.raises(openai.NotFoundError) as e:
        oa.embeddings.create(model="no_such_model", input="x")
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        oa.embeddings.create(model="tiny_llm", input="x")
    assert "not an embedding model" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        oa.embeddings.create(model="openai_embed", input="")
    assert e.value.body["param"] == "input"
    with pytest.raises(openai.NotFoundError):
        oa.chat.completions.create(model="openai_embed", messages=[{"role": "user", "content": "x"}])
