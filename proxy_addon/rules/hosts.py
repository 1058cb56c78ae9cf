"""Hosts: the well-known model APIs that pass through by default, and host keys with wildcards.

Model APIs (an agent's own LLM calls) are not business writes: they pass through, streamed, unless
`proxy.pass_model_apis: false` or the host's own entry says `journal: true`. docs/journaled.md lists the same hosts.

Host keys in config.yaml: `host:port` wins over `host`, which wins over `*.suffix` (the longest suffix wins);
`*.example.com` matches `a.example.com` and `a.b.example.com`, not `example.com`. Pure; no mitmproxy.
"""

import re
from collections.abc import Mapping
from fnmatch import fnmatchcase

# provider, API hostnames (a `*` matches any run of characters, dots included)
MODEL_APIS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("OpenAI", ("api.openai.com",)),
    ("Anthropic", ("api.anthropic.com",)),
    ("Google Gemini", ("generativelanguage.googleapis.com",)),
    ("Google Vertex AI", ("aiplatform.googleapis.com", "*-aiplatform.googleapis.com")),
    ("Mistral", ("api.mistral.ai", "codestral.mistral.ai")),
    ("Groq", ("api.groq.com",)),
    ("OpenRouter", ("openrouter.ai",)),
    ("Azure OpenAI", ("*.openai.azure.com",)),
    ("Azure AI Foundry", ("*.services.ai.azure.com", "*.models.ai.azure.com", "models.inference.ai.azure.com")),
    ("Amazon Bedrock", ("bedrock-runtime.*.amazonaws.com",)),
    ("Cohere", ("api.cohere.com", "api.cohere.ai")),
    ("DeepSeek", ("api.deepseek.com",)),
    ("Together AI", ("api.together.xyz", "api.together.ai")),
    ("Fireworks AI", ("api.fireworks.ai",)),
    ("xAI", ("api.x.ai",)),
    ("Perplexity", ("api.perplexity.ai",)),
    ("Cerebras", ("api.cerebras.ai",)),
    ("Hugging Face", ("router.huggingface.co", "api-inference.huggingface.co")),
    ("Voyage AI", ("api.voyageai.com",)),
    ("AI21", ("api.ai21.com",)),
    ("SambaNova", ("api.sambanova.ai",)),
    ("Moonshot AI", ("api.moonshot.ai", "api.moonshot.cn")),
    ("NVIDIA NIM", ("integrate.api.nvidia.com",)),
    ("DeepInfra", ("api.deepinfra.com",)),
    ("GitHub Models", ("models.github.ai",)),
    ("Replicate", ("api.replicate.com",)),
)
_EXACT = frozenset(h for _, hosts in MODEL_APIS for h in hosts if "*" not in h)
_PATTERNS = tuple(h for _, hosts in MODEL_APIS for h in hosts if "*" in h)
_WILDCARD_KEY = re.compile(r"^\*\.[^*:/\s]+$")


def is_model_api(host: str) -> bool:
    host = host.lower().rstrip(".")
    return host in _EXACT or any(fnmatchcase(host, p) for p in _PATTERNS)


def check_host_key(key: str) -> str:
    """A host key as config.yaml may write it (lower-cased), or ValueError naming what is wrong with it."""
    key = key.lower()
    if "*" in key and not _WILDCARD_KEY.match(key):
        raise ValueError(f"host key {key!r}: a wildcard is written *.suffix (no port, no other *)")
    return key


def find_host_entry[T](hosts: Mapping[str, T], host: str, port: int) -> T | None:
    """The entry for this host: `host:port`, else `host`, else the longest `*.suffix` that matches."""
    host = host.lower()
    entry = hosts.get(f"{host}:{port}")
    if entry is None:
        entry = hosts.get(host)
    if entry is None:
        labels = host.split(".")
        for i in range(1, len(labels)):
            entry = hosts.get("*." + ".".join(labels[i:]))
            if entry is not None:
                break
    return entry
