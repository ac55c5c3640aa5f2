"""LoRA adapters (`--lora-separator`) and logprobs on the OpenAI frontend end to end, with the
`openai` package against a vLLM-shaped model listing two adapters in its `multi_lora.json`
(tests/models/openai_lora)."""

import os
import shutil

import numpy as np
import openai
import pytest
from conftest import ROOT, Server

HELLO = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def oa(tmp_path_factory):
    repo = tmp_path_factory.mktemp("lora")
    for name in ("openai_lora", "tiny_llm"):
        base = "tests/models" if name.startswith("openai_") else "examples/models"
        shutil.copytree(os.path.join(ROOT, base, name), str(repo / name))
    # A TensorRT-LLM-shaped model whose adapters' weights are .npy files in the repository.
    shutil.copytree(os.path.join(ROOT, "tests", "models", "openai_trt_lora"), str(repo / "openai_trt_lora"))
    for i, name in enumerate(("doc", "sql")):
        adapter = repo / "openai_trt_lora" / "adapters" / name
        adapter.mkdir(parents=True)
        np.save(adapter / "model.lora_weights.npy", np.full((2, 4), i + 1, dtype=np.float16))
        np.save(adapter / "model.lora_config.npy", np.zeros((2, 3), dtype=np.int32))
    # A model whose own name holds the separator.
    shutil.copytree(os.path.join(ROOT, "examples", "models", "tiny_llm"), str(repo / "plain__model"))
    config = repo / "plain__model" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "tiny_llm"', 'name: "plain__model"'))
    srv = Server(str(repo), str(tmp_path_factory.mktemp("lora-log") / "tritium.log"), ["--lora-separator", "__"])
    try:
        srv.wait_models(["openai_lora", "tiny_llm", "plain__model", "openai_trt_lora"])
        yield openai.OpenAI(
            base_url=f"http://127.0.0.1:{srv.openai_port}/v1", api_key="unused", max_retries=0, timeout=60
        )
    finally:
        srv.stop()


def test_adapters_are_listed_as_their_own_models(oa):
    ids = [m.id for m in oa.models.list()]
    assert "openai_lora" in ids and "openai_lora__doc" in ids and "openai_lora__sql" in ids
    assert not [i for i in ids if i.startswith("tiny_llm__")], "a model without multi_lora.json has none"
    assert oa.models.retrieve("openai_lora__sql").id == "openai_lora__sql"


def test_an_adapter_reaches_the_model_in_the_sampling_parameters(oa):
    for model, adapter in (("openai_lora", "base"), ("openai_lora__doc", "doc"), ("openai_lora__sql", "sql")):
        r = oa.completions.create(model=model, prompt="one two")
        assert r.choices[0].text == f"adapter={adapter} one two"
        assert r.model == model
    r = oa.chat.completions.create(model="openai_lora__doc", messages=HELLO, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in r if c.choices).startswith("adapter=doc")


def test_trtllm_adapters_get_task_ids_and_weights_once(oa):
    ids = [m.id for m in oa.models.list()]
    assert "openai_trt_lora__doc" in ids and "openai_trt_lora__sql" in ids
    r = oa.completions.create(model="openai_trt_lora__sql", prompt="x")
    assert r.choices[0].text == "task=2 weights=2x4:16 config=2x3", "the first request carries the weights"
    r = oa.completions.create(model="openai_trt_lora__sql", prompt="x")
    assert r.choices[0].text == "task=2 weights=none config=none", "the model caches them by task id"
    r = oa.completions.create(model="openai_trt_lora__doc", prompt="x")
    assert r.choices[0].text == "task=1 weights=2x4:8 config=2x3"
    r = oa.completions.create(model="openai_trt_lora", prompt="x")
    assert r.choices[0].text == "task=none weights=none config=none"


def test_a_model_whose_name_holds_the_separator_is_that_model(oa):
    r = oa.completions.create(model="plain__model", prompt="one two")
    assert r.choices[0].text == "I heard: one two"
    assert oa.models.retrieve("plain__model").id == "plain__model"


def test_an_unknown_adapter_is_model_not_found(oa):
    for model in ("openai_lora__nope", "tiny_llm__doc", "nothing__doc"):
        with pytest.raises(openai.NotFoundError) as e:
            oa.completions.create(model=model, prompt="x")
        assert e.value.code == "model_not_found", model
    with pytest.raises(openai.NotFoundError):
        oa.models.retrieve("openai_lora__nope")


def test_logprobs_pass_through(oa):
    r = oa.chat.completions.create(model="openai_lora", messages=HELLO, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert [t.token for t in content] == ["adapter=base", " hello", " there"][: len(content)]
    assert len(content) == len(r.choices[0].message.content.split())
    assert content[1].logprob == -0.25 and [t.token for t in content[1].top_logprobs] == [" hello", "alt2"]
    r = oa.completions.create(model="openai_lora", prompt="a b", logprobs=3)
    lp = r.choices[0].logprobs
    assert lp.tokens == ["adapter=base", " a", " b"]
    assert lp.text_offset == [0, 12, 14]
    assert lp.top_logprobs[0] == {"adapter=base": 0.0, "alt2": -18.0, "alt3": -27.0}
    chunks = list(oa.chat.completions.create(model="openai_lora", messages=HELLO, logprobs=True, stream=True))
    streamed = [t.token for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert streamed[0] == "adapter=base" and len(streamed) >= 2


def test_logprobs_are_refused_where_the_model_cannot_return_them(oa):
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model="tiny_llm", messages=HELLO, logprobs=True)
    assert "logprobs" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model="openai_lora", messages=HELLO, top_logprobs=2)
    assert "top_logprobs" in e.value.message
