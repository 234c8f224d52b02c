"""Drives the real client libraries against a live server; runs in the clients' own environment
(.venv-clients, requirements/clients.txt), which cannot share one with transformers (see that file).

    python tests/clients/drive.py URL API_KEY CHECK...

prints one JSON object: for each check, what the client returned (vectors as lists) or the error it raised.
"""

from __future__ import annotations

import asyncio
import json
import sys

TEXTS = ["a crane is flying over the river", "the river flows to the sea", "She played the violin ."]


def langchain_openai_embeddings(url: str, key: str) -> dict:
    from langchain_openai import OpenAIEmbeddings

    embedder = OpenAIEmbeddings(base_url=url + "/v1", api_key=key, model="bert", check_embedding_ctx_length=False)
    return {"documents": embedder.embed_documents(TEXTS), "query": embedder.embed_query(TEXTS[0]),
            "async": asyncio.run(embedder.aembed_documents(TEXTS[:2]))}


def langchain_openai_defaults(url: str, key: str) -> dict:
    """LangChain's defaults tokenize with tiktoken and send token-id arrays. tiktoken's tables come from the
    internet, which this machine lacks: a byte-level table of the same kind stands in (the ids differ, the
    request LangChain makes does not)."""
    import openai
    import tiktoken
    from langchain_openai import OpenAIEmbeddings

    byte_level = tiktoken.Encoding("bytes", pat_str=r"\S+|\s+", mergeable_ranks={bytes([b]): b for b in range(256)},
                                   special_tokens={})
    tiktoken.encoding_for_model = lambda _model: byte_level
    tiktoken.get_encoding = lambda _name: byte_level
    embedder = OpenAIEmbeddings(base_url=url + "/v1", api_key=key, model="bert", max_retries=0)
    try:
        embedder.embed_documents(TEXTS[:1])
    except openai.BadRequestError as exc:
        return {"status": exc.status_code, "message": exc.body["message"]}
    return {"status": 200}


def langchain_huggingface_embeddings(url: str, key: str, model_kwargs: dict | None = None) -> dict:
    """From 1.2.2 on, langchain-huggingface refuses a URL as `model` (earlier versions took the server's URL);
    the documented way is to hand it huggingface_hub clients pointed at the server."""
    from huggingface_hub import AsyncInferenceClient, InferenceClient
    from langchain_huggingface import HuggingFaceEndpointEmbeddings

    embedder = HuggingFaceEndpointEmbeddings(model="bert-serve", huggingfacehub_api_token=key,
                                             model_kwargs=model_kwargs)
    embedder.client = InferenceClient(base_url=url, token=key)
    embedder.async_client = AsyncInferenceClient(base_url=url, token=key)
    return {"documents": embedder.embed_documents(TEXTS), "query": embedder.embed_query(TEXTS[0]),
            "async": asyncio.run(embedder.aembed_documents(TEXTS[:2]))}


def langchain_huggingface_embeddings_normalized(url: str, key: str) -> dict:
    """On a classifier or cross-encoder the root route classifies bare inputs (as TEI's does); a
    feature-extraction field such as `normalize` asks for vectors instead."""
    return langchain_huggingface_embeddings(url, key, model_kwargs={"normalize": True})


def llama_index_tei(url: str, key: str) -> dict:
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    embedder = TextEmbeddingsInference(base_url=url, model_name="bert", auth_token=key)
    return {"documents": embedder.get_text_embedding_batch(TEXTS), "query": embedder.get_query_embedding(TEXTS[0]),
            "async": asyncio.run(embedder.aget_text_embedding_batch(TEXTS[:2]))}


def llama_index_openai_like(url: str, key: str) -> dict:
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding

    embedder = OpenAILikeEmbedding(model_name="bert", api_base=url + "/v1", api_key=key)
    return {"documents": embedder.get_text_embedding_batch(TEXTS), "query": embedder.get_query_embedding(TEXTS[0])}


def inference_client_hub1(url: str, key: str) -> dict:
    """huggingface_hub 1.x (what langchain-huggingface pins), beside the 2.x of the main environment."""
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=url, token=key)
    return {"version": __import__("huggingface_hub").__version__,
            "features": client.feature_extraction(TEXTS[0]).tolist(),
            "similarity": client.sentence_similarity(TEXTS[0], TEXTS[1:])}


def inference_client_hub1_token_classification(url: str, key: str) -> dict:
    """huggingface_hub 1.x against a token classifier: entities as dicts."""
    from huggingface_hub import InferenceClient

    entities = InferenceClient(base_url=url, token=key).token_classification(TEXTS[2], aggregation_strategy="first")
    return {"entities": [dict(e) for e in entities]}


def inference_client_hub1_question_answering(url: str, key: str) -> dict:
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=url, token=key)
    return {"best": dict(client.question_answering(question="who played ?", context=TEXTS[2])),
            "top": [dict(a) for a in client.question_answering(question="who played ?", context=TEXTS[2], top_k=2)]}


QUERY = "where does the river flow ?"


def cohere_rerank(url: str, key: str) -> dict:
    """The Cohere SDK with a base URL: its v1 client (top_n, return_documents), its v2 client, and the error it raises
    for a request the server refuses."""
    import cohere

    v1 = cohere.Client(api_key=key, base_url=url).rerank(model="bert-serve", query=QUERY, documents=TEXTS, top_n=2,
                                                         return_documents=True)
    client = cohere.ClientV2(api_key=key, base_url=url)
    v2 = client.rerank(model="bert-serve", query=QUERY, documents=TEXTS)
    try:
        client.rerank(model="bert-serve", query=QUERY, documents=TEXTS, top_n=0)
        refused = None
    except cohere.errors.BadRequestError as exc:
        refused = {"status": exc.status_code, "body": exc.body}
    return {"version": cohere.__version__,
            "v1": [{"index": r.index, "score": r.relevance_score, "text": r.document.text} for r in v1.results],
            "v2": [{"index": r.index, "score": r.relevance_score} for r in v2.results], "refused": refused}


def langchain_cohere_rerank(url: str, key: str) -> dict:
    """LangChain's CohereRerank (it calls Cohere's v2 client) as a document compressor."""
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    reranker = CohereRerank(model="bert-serve", cohere_api_key=key, base_url=url, top_n=2)
    kept = reranker.compress_documents([Document(page_content=text) for text in TEXTS], QUERY)
    return {"documents": [{"text": d.page_content, "score": d.metadata["relevance_score"]} for d in kept]}


CHECKS = {f.__name__: f for f in (langchain_openai_embeddings, langchain_openai_defaults,
                                  langchain_huggingface_embeddings, langchain_huggingface_embeddings_normalized,
                                  llama_index_tei, llama_index_openai_like, inference_client_hub1,
                                  inference_client_hub1_token_classification,
                                  inference_client_hub1_question_answering, cohere_rerank,
                                  langchain_cohere_rerank)}


def main() -> None:
    url, key, *names = sys.argv[1:]
    results = {}
    for name in names:
        try:
            results[name] = CHECKS[name](url, key)
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
            results[name] = {"raised": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
