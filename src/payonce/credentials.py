"""The request headers that carry a caller's credential: shared by the gateway and the client.

The gateway scopes records by a hash of them (docs/gateway.md, "Tenants"); the client
sends them with its status lookups so the gateway finds the caller's records.
Both read this one list, so they cannot drift apart.
"""

from __future__ import annotations

__all__ = ["CREDENTIAL_HEADERS"]

# Lower-case names. Authorization: OpenAI, Mistral, Cohere, Groq, Together,
# OpenRouter, Hugging Face, vLLM, TGI, Azure with Entra ID (a "Bearer " prefix is
# dropped); x-api-key: Anthropic; api-key: Azure OpenAI; x-goog-api-key: Google
# Gemini. Others are added with --credential-header.
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key", "x-goog-api-key")
