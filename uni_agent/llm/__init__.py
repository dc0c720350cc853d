"""The model client: an OpenAI-compatible chat client (client.py), what a call returns and how it fails (reply.py),
and token capture, each call's tokens as the engine reports them (tokens.py)."""

from .client import CONTEXT_MARKERS, ChatClient, check_endpoint
from .reply import ChatReply, ContextLimitError, EndpointDownError, LLMError, TokenContext, TransientLLMError
from .tokens import TOKEN_CAPTURE, token_capture_for

__all__ = ["CONTEXT_MARKERS", "TOKEN_CAPTURE", "ChatClient", "ChatReply", "ContextLimitError", "EndpointDownError",
           "LLMError", "TokenContext", "TransientLLMError", "check_endpoint", "token_capture_for"]
